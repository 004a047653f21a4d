"""Other holders of a version, to fetch from when its origin is far or away.

The catalog says which regions hold a version completed (`Catalog.holders`); etcd
says where their agents listen (`/meridian/agents/<region>/<agent id>`, a JSON value
with the agent's `endpoint`, registered by each agent on its lease, so a dead
agent drops out). Best effort: when either cannot answer, the origin alone is
tried (guard.sources_for puts every source in RTT order).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Protocol

from controlplane.coordination.protocols.keys import ROOT
from controlplane.domain.events import ChangeEvent
from controlplane.ports.coordination import KeyValue
from replicator.ports import Source

AGENTS = ROOT + "agents/"


class HolderRegions(Protocol):
    def holders(self, dataset: str, key: str, version: str) -> list[str]: ...


class PrefixReader(Protocol):
    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]: ...


def endpoint_of(value: bytes) -> str | None:
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    found = doc.get("endpoint") or doc.get("address")
    return found if isinstance(found, str) and found else None


def _direct(_region: str, address: str) -> str:
    return address


class RegistryHolders:
    def __init__(
        self,
        catalog: HolderRegions,
        etcd: PrefixReader,
        route: Callable[[str, str], str] = _direct,
    ) -> None:
        self._catalog = catalog
        self._etcd = etcd
        self._route = route

    async def agents_of(self, region: str) -> list[Source]:
        """The agents `region` has registered in etcd (routed), in key order."""
        kvs, _ = await self._etcd.get_prefix(f"{AGENTS}{region}/")
        return [
            Source(region, self._route(region, endpoint))
            for kv in kvs
            if (endpoint := endpoint_of(kv.value)) is not None
        ]

    async def holders(self, event: ChangeEvent) -> list[Source]:
        regions = await asyncio.to_thread(
            self._catalog.holders, event.dataset, event.key, str(event.version.hlc)
        )
        out: list[Source] = []
        for region in regions:
            out.extend(await self.agents_of(region))
        return out
