"""The critical-class workload: writes through the owner region's agent with its epoch.

One single-threaded client per region: it reads the dataset's owner and epoch from
etcd *through its region's proxies* (a region cut from etcd cannot learn it lost
ownership, and keeps writing with the epoch it last read: the agents and replicas
must refuse it), and when its region is the owner it puts a small object (unique id stamped
in it, digest computed here) to its own agent with that epoch. The agent admits it
against etcd's owner record, commits, and pushes it synchronously to the replicas:
the ack means the policy's copies hold it. Every write has a key of its own (its
id), so no later write can supersede it: an acked write missing is lost, plainly.

Outcomes: `ok` when acknowledged (the digest is checked); `fail` when etcd named
another owner (nothing sent) or the agent refused it definitively before storing
anything (residency, bad input); `info` for everything else: an unacked write
(`UnavailableError`) and a deposed owner's `StaleEpochError` from a replica both
leave the owner's local copy, which catch-up may still spread.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping, Sequence

from agents.client import AgentClient
from chaos.dataplane import AgentClients, content, definite_refusal, digest_of
from chaos.history import EventType, History
from chaos.workload import RegionClients

OP_TIMEOUT_S = 6.0
SIZE = 8192


class CriticalWorkload(AgentClients):
    """One client per region in `agents` (region -> its agent's address) until stopped."""

    role = "critical"

    def __init__(
        self,
        history: History,
        regions: Mapping[str, RegionClients],
        agents: Mapping[str, str],
        datasets: Sequence[str],
        *,
        seed: int,
        interval_s: float = 0.1,
        key_prefix: str = "",
    ) -> None:
        rng = random.Random(seed ^ 0xC217)  # noqa: S311 - replayable from the seed
        super().__init__(agents, rng, interval_s=interval_s, op_timeout_s=OP_TIMEOUT_S)
        self.history = history
        self.regions = dict(regions)
        self.datasets = list(datasets)
        self.seed = seed
        self.key_prefix = key_prefix

    async def step(self, client: AgentClient, region: str, name: str, rng: random.Random) -> None:
        await self._write(client, self.regions[region], name, rng.choice(self.datasets))

    async def _write(self, client: AgentClient, rc: RegionClients, name: str, dataset: str) -> None:
        op_id = History.new_id("c")
        key = f"{self.key_prefix}{op_id}"
        data = content(self.seed, dataset, key, op_id, SIZE)
        digest = digest_of(data)
        inv = self.history.invoke(name, "write", rc.region, dataset, key, op_id, digest=digest)
        owner = await rc.owner_here(dataset, OP_TIMEOUT_S / 2)
        if isinstance(owner, str):
            self.history.complete(inv, "fail", error=owner)
            return

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        try:
            version = await asyncio.wait_for(
                client.put(dataset, key, chunks(), size=len(data), epoch=owner.epoch),
                OP_TIMEOUT_S,
            )
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded
            outcome: EventType = "fail" if definite_refusal(exc) else "info"
            self.history.complete(
                inv, outcome, error=f"{type(exc).__name__}: {exc}"[:200], epoch=owner.epoch
            )
            return
        if str(version.digest) != digest:
            self.history.complete(inv, "info", error=f"the agent stored digest {version.digest}")
            return
        self.history.complete(inv, "ok", version=str(version.hlc), epoch=owner.epoch)
