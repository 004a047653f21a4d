"""A region of several real agent processes for the placement tests (issue 16).

    region = RegionOfAgents(tmp_path, env, "eu-west")
    region.add(4)                      # four `meridian agent serve` processes
    await region.wait_members(4)       # every registration is in etcd
    holders = await region.holdings()  # agent id -> {(dataset, key): version}

`holdings` asks each agent for its own objects only: a List marked as routed (the
metadata `x-meridian-routed-by`) is served locally by the agent that receives it.
Every wait here is bounded in time and count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import waiting
from harness.agent_process import AgentProcess

from agents.routing.peers import ROUTED_KEY
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.loopback import free_port
from meridian.v1 import agent_pb2, agent_pb2_grpc

Holdings = dict[str, dict[tuple[str, str], str]]


@dataclass
class RegionOfAgents:
    folder: Path
    env: dict[str, str]
    region: str = "eu-west"
    lease_ttl_s: int = 3
    agents: list[AgentProcess] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)

    def add(
        self, count: int = 1, *, weight: int = 1, metrics: bool = False, fixed_port: bool = False
    ) -> list[AgentProcess]:
        """Start `count` agents; `fixed_port`: each on a port of its own below the ephemeral
        range (controlplane.loopback), so that it can be restarted on the same address."""
        started = []
        for _ in range(count):
            n = len(self.agents)
            proc = AgentProcess(
                self.region,
                self.folder / f"agent-{n}",
                self.env,
                self.folder / f"agent-{n}.log",
                lease_ttl_s=self.lease_ttl_s,
                extra_args=["--weight", str(weight)],
                metrics=metrics,
                port=free_port() if fixed_port else 0,
            )
            proc.spawn()
            self.agents.append(proc)
            started.append(proc)
        for proc in started:  # spawned together, waited for together
            event = proc.wait_event("agent_ready", 60)
            if event is None:
                raise RuntimeError(f"agent did not start: {proc.log_tail()}")
            proc.address = str(event["endpoint"])
            proc.metrics_address = str(event.get("metrics") or "")
            self.ids[proc.log_path.name] = str(event["id"])
        return started

    def agent_id(self, proc: AgentProcess) -> str:
        return self.ids[proc.log_path.name]

    def live(self) -> list[AgentProcess]:
        return [a for a in self.agents if a.running]

    def stop_all(self) -> None:
        for proc in self.agents:
            if proc.running:
                proc.kill()

    async def registrations(self) -> dict[str, dict[str, object]]:
        coord = EtcdCoordination([self.env["MERIDIAN_ETCD"]], timeout_s=5.0)
        await coord.connect()
        try:
            kvs, _ = await coord.get_prefix(keys.agents_of(self.region))
        finally:
            await coord.close()
        return {kv.key.rsplit("/", 1)[-1]: json.loads(kv.value) for kv in kvs}

    async def wait_members(self, count: int, timeout_s: float = 30) -> None:
        await until(lambda: self._count_is(count), timeout_s, f"{count} registrations")

    async def _count_is(self, count: int) -> bool:
        return len(await self.registrations()) == count

    async def wait_settled(self, count: int, timeout_s: float = 30) -> None:
        """Until `count` agents are registered and each settled a rebalance pass under all
        of them: every agent's membership view then holds them all, so a write through
        any lands on its final owners (etcd lists an agent before every watch saw it)."""

        async def settled() -> bool:
            regs = await self.registrations()
            return len(regs) == count and all(
                len(r.get("settled") or ()) == count  # type: ignore[arg-type]
                for r in regs.values()
            )

        await until(settled, timeout_s, f"{count} agents settled under one another")

    async def holdings(self) -> Holdings:
        """Each live agent's own objects (newest version text), by agent id."""
        found: Holdings = {}
        for proc in self.live():
            found[self.agent_id(proc)] = await local_objects(proc.address)
        return found


def clear_prefix(etcd: str, prefix: str) -> None:
    """Delete every key under `prefix` (the killed agents' registrations)."""

    async def clear() -> None:
        coord = EtcdCoordination([etcd], timeout_s=5.0)
        await coord.connect()
        try:
            await coord.delete(prefix, prefix=True)
        finally:
            await coord.close()

    # In a thread of its own: asyncio.run here would replace the session's event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, clear()).result(timeout=30)


async def local_objects(address: str, dataset: str | None = None) -> dict[tuple[str, str], str]:
    datasets = [dataset] if dataset else ["corpus/a", "corpus/b", "eu/a"]
    out: dict[tuple[str, str], str] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        for ds in datasets:
            token = ""
            for _ in range(1000):
                page: agent_pb2.ListResponse = await stub.List(
                    agent_pb2.ListRequest(dataset=ds, page_token=token, page_size=1000),
                    metadata=((ROUTED_KEY, "test"),),
                    timeout=30,
                )
                for info in page.objects:
                    out[(ds, info.key)] = info.version.hlc
                token = page.next_page_token
                if not token:
                    break
    return out


async def until(
    check: Callable[[], object], timeout_s: float, what: str, *, poll_s: float = 0.1
) -> None:
    """Await `check()` (sync or async) until it is truthy, bounded (waiting.until)."""
    await waiting.until(check, timeout_s, what, step_s=poll_s)


def copies(holdings: Holdings) -> dict[tuple[str, str], set[str]]:
    """Object -> the agents holding it."""
    out: dict[tuple[str, str], set[str]] = {}
    for agent_id, held in holdings.items():
        for name in held:
            out.setdefault(name, set()).add(agent_id)
    return out
