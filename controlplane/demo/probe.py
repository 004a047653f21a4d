"""In-process reads and writes for the demo's waits, bulk writes and live view.

The demo's checks go through the `meridian` CLI as a user's would; what it polls (an
owner, a listing) or writes in bulk (corpus shards, in two regions at once) goes
through the same client libraries in this process, so that a poll costs a round trip
instead of a Python start-up on a loaded machine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.client import AgentClient
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import MeridianError, NotFoundError


@dataclass(frozen=True)
class PutItem:
    agent: str
    dataset: str
    key: str
    path: Path


class Probe:
    def __init__(self, etcd: str, *, timeout_s: float = 5) -> None:
        self.etcd = [e.strip() for e in etcd.split(",") if e.strip()]
        self.timeout_s = timeout_s

    def owners(self) -> dict[str, tuple[str, int]]:
        """Dataset → (owner region, epoch), from etcd; empty when etcd does not answer."""

        async def read() -> dict[str, tuple[str, int]]:
            async with EtcdCoordination(self.etcd, timeout_s=self.timeout_s) as coord:
                found = await Ownership(coord).list()
            return {name: (o.region, o.epoch) for name, o in found.items()}

        try:
            return asyncio.run(read())
        except MeridianError:
            return {}

    def owner(self, dataset: str) -> tuple[str | None, int | None]:
        region, epoch = self.owners().get(dataset, (None, None))
        return region, epoch

    def listing(self, agent: str, dataset: str) -> dict[str, str] | None:
        """Key → newest version (HLC) held by the agent; None when it does not answer."""

        async def read() -> dict[str, str]:
            async with AgentClient(agent, timeout_s=self.timeout_s) as client:
                found = await client.list(dataset)
            return {o.key: str(o.version.hlc) for o in found if o.version.op == "put"}

        try:
            return asyncio.run(read())
        except MeridianError:
            return None

    def shows_set(self, agent: str, dataset: str, set_id: str) -> bool | None:
        """Whether the agent's newest complete set of `dataset` is `set_id` (what
        `object get --set latest` reads there); None when the agent does not answer."""

        async def read() -> str:
            async with AgentClient(agent, timeout_s=self.timeout_s) as client:
                return (await client.get_set(dataset)).id

        try:
            return asyncio.run(read()) == set_id
        except NotFoundError:
            return False  # no complete set there yet
        except MeridianError:
            return None

    def transfers(self, catalog: str, dataset: str) -> list[dict[str, Any]]:
        """The catalog's transfer records of `dataset` (what `audit transfers` shows)."""
        from controlplane.catalog.api import open_catalog

        try:
            with open_catalog(catalog) as cat:
                return cat.transfers(dataset_glob=dataset)
        except MeridianError:
            return []

    def put(self, agent: str, dataset: str, key: str, data: bytes) -> tuple[str | None, str]:
        """Store `data` as `dataset/key` at `agent`: (the acked version's HLC, "") or
        (None, why not)."""

        async def one() -> str:
            async with AgentClient(agent, timeout_s=60) as client:
                return str((await client.put(dataset, key, data)).hlc)

        try:
            return asyncio.run(one()), ""
        except MeridianError as exc:
            return None, str(exc)

    def put_many(self, items: Sequence[PutItem], *, concurrency: int = 8) -> list[str]:
        """Store every item, `concurrency` at a time across agents; the errors (empty
        when all were acked)."""

        async def put_all() -> list[str]:
            gate = asyncio.Semaphore(concurrency)
            clients = {a: AgentClient(a, timeout_s=60) for a in {i.agent for i in items}}

            async def put(item: PutItem) -> str | None:
                async with gate:
                    try:
                        await clients[item.agent].put(item.dataset, item.key, item.path)
                    except MeridianError as exc:
                        return f"{item.key} at {item.agent}: {exc}"
                return None

            try:
                results = await asyncio.gather(*(put(i) for i in items))
            finally:
                for client in clients.values():
                    await client.close()
            return [r for r in results if r is not None]

        return asyncio.run(put_all())
