"""Where to reach another region's agent: its registration in etcd
(`/meridian/agents/<region>/<id>`, agents/daemon/registration.py), routed through
`Settings.agent_address` (so the demo and the chaos suite can put a Toxiproxy proxy
on each link)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from controlplane.coordination.protocols import keys
from controlplane.errors import MeridianError, UnavailableError
from controlplane.ports.coordination import Coordination

Route = Callable[[str, str], str]


class NoAgentError(UnavailableError):
    """No agent of the region is registered (retriable: one may register)."""


class Peers(Protocol):
    """The address of an agent of `region` to push to; `UnavailableError` when none is
    registered (or etcd cannot say)."""

    async def address(self, region: str) -> str: ...


def _direct(_region: str, address: str) -> str:
    return address


class EtcdPeers:
    """Peers read from the agents' registrations at each push: a registration goes
    with its agent's lease, so a stopped agent is not dialled for long."""

    def __init__(self, coord: Coordination, route: Route = _direct) -> None:
        self._coord = coord
        self._route = route

    async def address(self, region: str) -> str:
        try:
            kvs, _ = await self._coord.get_prefix(keys.agents_of(region))
        except MeridianError as exc:
            raise UnavailableError(
                f"the agents of region {region} cannot be read from etcd ({exc})"
            ) from exc
        for kv in kvs:
            endpoint = _endpoint(kv.value)
            if endpoint is not None:
                return self._route(region, endpoint)
        raise NoAgentError(f"region {region} has no agent registered in etcd")


def _endpoint(value: bytes) -> str | None:
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    found = doc.get("endpoint") if isinstance(doc, dict) else None
    return found if isinstance(found, str) and found else None
