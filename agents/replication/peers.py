"""Where to reach another region's agent: its registration in etcd
(`/meridian/agents/<region>/<id>`, agents/daemon/registration.py), routed through
`Settings.agent_address` (so the demo and the chaos suite can put a Toxiproxy proxy
on each link).

An address may be reused for `max_age_s` (the synchronous push asks for one at every
write: reading etcd each time cost every critical write two etcd round trips, issue
13's benchmark). A reused address is only where to dial, never a decision: the
replica's own admission fences what it is sent, its answer names its region (the
push checks it), and a push that fails forgets the address so the next one reads
etcd again.
"""

from __future__ import annotations

import json
import time
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
    registered (or etcd cannot say). `forget(region)`: that address failed, read it
    again next time."""

    async def address(self, region: str) -> str: ...

    def forget(self, region: str) -> None: ...


def _direct(_region: str, address: str) -> str:
    return address


class EtcdPeers:
    """Peers read from the agents' registrations: a registration goes with its agent's
    lease, so a stopped agent is not dialled for long. With `max_age_s` > 0 an address
    read is reused that long (until `forget`); 0 reads etcd at every call."""

    def __init__(
        self,
        coord: Coordination,
        route: Route = _direct,
        *,
        max_age_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coord = coord
        self._route = route
        self.max_age_s = max_age_s
        self._clock = clock
        self._known: dict[str, tuple[str, float]] = {}  # region -> (address, read at)

    async def address(self, region: str) -> str:
        known = self._known.get(region)
        if known is not None and self._clock() - known[1] <= self.max_age_s:
            return known[0]
        started = self._clock()
        found = await self.addresses(region)
        if not found:
            self._known.pop(region, None)
            raise NoAgentError(f"region {region} has no agent registered in etcd")
        if self.max_age_s > 0:
            self._known[region] = (found[0], started)
        return found[0]

    def forget(self, region: str) -> None:
        self._known.pop(region, None)

    async def addresses(self, region: str) -> list[str]:
        """Every agent `region` has registered (routed), in key order: what asks for an
        object one agent of a region may not hold (a region of several agents places
        each object on a few of them) tries the others."""
        try:
            kvs, _ = await self._coord.get_prefix(keys.agents_of(region))
        except MeridianError as exc:
            raise UnavailableError(
                f"the agents of region {region} cannot be read from etcd ({exc})"
            ) from exc
        return [
            self._route(region, endpoint)
            for kv in kvs
            if (endpoint := registered_endpoint(kv.value)) is not None
        ]


def registered_endpoint(value: bytes) -> str | None:
    """The address an agent's registration (its etcd value) names; None when it is
    unreadable or names none."""
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    found = doc.get("endpoint") if isinstance(doc, dict) else None
    return found if isinstance(found, str) and found else None
