"""Injectors: turn a scheduled `Fault` into actions on the world, and undo them.

Each `begin` returns what it actually did (the resolved target) for the run's
log; each `end` undoes exactly that. "owner" targets resolve, when the fault
begins, to the region owning most critical datasets then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field

from chaos.nemesis import Fault
from chaos.workload import FencedWorkload, OwnerSampler
from chaos.world import ChaosWorld, signal_daemon
from controlplane.errors import StackError
from controlplane.logs import get_logger

log = get_logger("meridian.chaos")


def stop_postgres_fast(world: ChaosWorld, timeout_s: float = 20.0) -> None:
    """Stop PostgreSQL in its *fast* mode (SIGINT: sessions are cut, as when a catalog
    host goes down). SIGTERM's smart mode would wait for every client to leave, which
    the controllers never do, so the fault would begin only after a long stall."""
    process = world.stack.postgres.process
    pid = process.pid()
    if pid is None:
        # Not a fault that "held": the catalog was never up, so nothing was tested.
        raise StackError("PostgreSQL is not running: the stop-catalog fault cannot begin")
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while process.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.pid() is not None:
        process.kill()


@dataclass
class Injector:
    world: ChaosWorld
    workload: FencedWorkload
    sampler: OwnerSampler
    _undo: dict[int, list[str]] = field(default_factory=dict)  # id(fault) -> killed members
    _flappers: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    clock_offset_ms: int = 0  # what a `skew-clock` fault shifts its region's HLC by
    _operators: dict[int, asyncio.Task[str]] = field(default_factory=dict)
    # What each operator action of the run answered (the run's log and result.json).
    operator_log: list[str] = field(default_factory=list)

    def _force_failover(self, source: str, to: str) -> str:
        argv = ["failover", "--from", source, "--to", to, "--force", "--yes"]
        try:
            done = self.world.cli(*argv, "--reason", "chaos: only this region reaches etcd",
                                  timeout_s=60)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"meridian {' '.join(argv)}: no answer within 60 s"
        said = (done.stderr or done.stdout).strip().splitlines()
        return f"meridian {' '.join(argv)} exited {done.returncode}: {said[-1] if said else ''}"

    def _agent_links(self, region: str | None = None) -> list[str]:
        """Every agent-to-agent proxy (both directions) touching `region`, or all of them."""
        out = []
        for r in self.world.regions.values():
            for link in r.proxies:
                if not link.startswith("agent-to-"):
                    continue
                if region is None or r.name == region or link == f"agent-to-{region}":
                    out.append(r.proxy_name(link))
        return out

    async def _flap(self, proxies: list[str], seed: int) -> None:
        """Disable then enable `proxies` every 1-2 s (drawn from `seed`) until cancelled."""
        rng = random.Random(seed)  # noqa: S311 - replayable from the scenario's seed
        enabled = True
        for _ in range(10_000):  # bounded; cancelled at the fault's end
            enabled = not enabled
            for proxy in proxies:
                await self.world.toxi.set_enabled(proxy, enabled)
            await asyncio.sleep(rng.uniform(1.0, 2.0))

    def _owner(self) -> str:
        counts = Counter(s.region for s in self.sampler.latest().values())
        if counts:
            return counts.most_common(1)[0][0]
        return next(iter(self.world.regions))

    async def begin(self, fault: Fault) -> str:
        w = self.world
        if fault.kind == "cut-etcd":
            region = w.regions[self._owner()]
            for proxy in region.links("etcd"):
                await w.toxi.cut(proxy)
            return f"cut {region.name} from etcd"
        if fault.kind in ("cut-etcd-up", "cut-etcd-down"):
            region = w.regions[self._owner()]
            stream = "upstream" if fault.kind == "cut-etcd-up" else "downstream"
            for proxy in region.links("etcd"):
                await w.toxi.cut(proxy, streams=(stream,))
            what = "requests" if stream == "upstream" else "replies"
            return f"cut {region.name}'s etcd {what} only (one way)"
        if fault.kind == "isolate":
            region = w.regions[self._owner()]
            for link in region.proxies:
                await w.toxi.cut(region.proxy_name(link))
            return f"isolated {region.name} from everything ({', '.join(sorted(region.proxies))})"
        if fault.kind == "sigstop":
            region = w.regions[self._owner()]
            self.workload.regions[region.name].pause()
            stopped: list[str] = [k for k in ("agent", "controller") if k in region.daemons]
            for name in stopped:
                signal_daemon(region.daemons[name], signal.SIGSTOP)
            self._undo[id(fault)] = [region.name]
            return f"SIGSTOP {region.name} {' and '.join(stopped)}"
        if fault.kind in ("kill-agent", "kill-replicator"):
            kind = fault.kind.removeprefix("kill-")
            region = w.regions[fault.target]
            await asyncio.to_thread(region.daemons[kind].kill)
            self._undo[id(fault)] = [region.name]
            return f"SIGKILL {region.name} {kind}"
        if fault.kind == "restart-kafka":
            await asyncio.to_thread(w.stack.kafka.process.kill)
            return "SIGKILL the Kafka broker"
        if fault.kind in ("limit-data", "reset-peer", "slicer", "reset-peer-0.3"):
            proxies = self._agent_links(None if fault.target == "all" else fault.target)
            for proxy in proxies:
                if fault.kind == "limit-data":  # each connection closed after 256 KiB
                    await w.toxi.add_toxic(proxy, "limit_data", {"bytes": 256 * 1024})
                elif fault.kind == "reset-peer":
                    await w.toxi.add_toxic(proxy, "reset_peer", {"timeout": 300})
                elif fault.kind == "reset-peer-0.3":
                    await w.toxi.add_toxic(proxy, "reset_peer", {"timeout": 0}, toxicity=0.3)
                else:  # TCP segments sliced small and delayed: many short reads
                    await w.toxi.add_toxic(
                        proxy,
                        "slicer",
                        {"average_size": 512, "size_variation": 256, "delay": 50},
                    )
            return f"{fault.kind} on {len(proxies)} agent links ({fault.target})"
        if fault.kind == "cut-pair":  # A<->B cut both ways; both still reach everyone else
            a, b = fault.target.split("|")
            proxies = [w.regions[a].proxy_name(f"agent-to-{b}")]
            proxies.append(w.regions[b].proxy_name(f"agent-to-{a}"))
            for proxy in proxies:
                await w.toxi.cut(proxy)
            return f"cut the agent links {a} <-> {b} (both still reach the others)"
        if fault.kind == "wan":
            agents = self._agent_links()
            kafka = [p for r in w.regions.values() for p in r.links("kafka")]
            for proxy in agents + kafka:
                await w.toxi.add_toxic(proxy, "latency", {"latency": 100, "jitter": 50})
            for proxy in agents:  # KB/s: a 1 MiB/s cap on every agent (delta) link
                await w.toxi.add_toxic(proxy, "bandwidth", {"rate": 1024})
            return (
                f"100+/-50 ms each way on {len(agents) + len(kafka)} agent and Kafka links, "
                f"1 MiB/s on the {len(agents)} agent links"
            )
        if fault.kind == "strand-compliant":
            owner = w.regions[self._owner()]
            for link in owner.proxies:
                await w.toxi.cut(owner.proxy_name(link))
            others = []
            for region in w.regions.values():
                if region is owner or region.jurisdiction != owner.jurisdiction:
                    continue
                others.append(region.name)
                for proxy in region.links("etcd"):
                    await w.toxi.cut(proxy)
            # An operator who can only reach etcd from outside the residency tries to
            # force the datasets there: the failover must refuse (runbook residency rule).
            outside = next(
                r.name for r in w.regions.values() if r.jurisdiction != owner.jurisdiction
            )
            self._operators[id(fault)] = asyncio.create_task(
                asyncio.to_thread(self._force_failover, owner.name, outside)
            )
            return (
                f"isolated {owner.name} and cut {', '.join(others)} from etcd: only regions "
                f"outside {owner.jurisdiction} reach etcd; an operator forces a failover of "
                f"{owner.name} to {outside}"
            )
        if fault.kind == "skewed":
            # The skew itself is set when the region's agent and replicator start (a
            # restart costs tens of seconds on a loaded machine); these windows pace
            # the run and name what holds during them.
            offset = self.clock_offset_ms
            return f"{fault.target}'s agent and replicator run {offset:+d} ms off (since start)"
        if fault.kind == "flap":
            proxies = self._agent_links(fault.target) + w.regions[fault.target].links("kafka")
            seed = int(fault.start_s * 1000)
            self._flappers[id(fault)] = asyncio.create_task(self._flap(proxies, seed))
            return f"flapping {len(proxies)} links of {fault.target} every 1-2 s"
        cluster = w.stack.etcd_cluster()
        if fault.kind == "kill-etcd-leader":
            leader = await asyncio.to_thread(cluster.leader_index)
            index = 0 if leader is None else leader
            await asyncio.to_thread(cluster.members[index].kill)
            self._undo[id(fault)] = [str(index)]
            return f"killed etcd member {index} (the leader: {leader is not None})"
        if fault.kind == "etcd-quorum-loss":
            leader = await asyncio.to_thread(cluster.leader_index)
            victims = [i for i in range(3) if i != leader][:2] if leader is not None else [1, 2]
            for i in victims:
                await asyncio.to_thread(cluster.members[i].kill)
            self._undo[id(fault)] = [str(i) for i in victims]
            return f"killed etcd members {victims} (quorum lost)"
        if fault.kind == "stop-catalog":
            await asyncio.to_thread(stop_postgres_fast, w)
            return "stopped PostgreSQL"
        raise ValueError(f"no injector for fault kind {fault.kind!r}")

    async def end(self, fault: Fault) -> None:
        w = self.world
        if fault.kind == "skewed":
            return
        operator = self._operators.pop(id(fault), None)
        if operator is not None:
            said = await operator
            self.operator_log.append(said)
            log.info("chaos_operator", answer=said)
        if fault.kind in (
            "cut-etcd", "cut-etcd-up", "cut-etcd-down", "isolate", "cut-pair", "wan",
            "strand-compliant",
        ):  # fmt: skip
            for region in w.regions.values():
                for link in region.proxies:
                    await w.toxi.clear(region.proxy_name(link))
        elif fault.kind == "sigstop":
            for name in self._undo.pop(id(fault), []):
                for daemon in w.regions[name].daemons.values():
                    signal_daemon(daemon, signal.SIGCONT)
                self.workload.regions[name].unpause()
        elif fault.kind in ("kill-etcd-leader", "etcd-quorum-loss"):
            cluster = w.stack.etcd_cluster()
            for i in self._undo.pop(id(fault), []):
                await asyncio.to_thread(cluster.members[int(i)].start)
            await asyncio.to_thread(cluster.wait_healthy, 60.0)
        elif fault.kind == "stop-catalog":
            await asyncio.to_thread(w.stack.postgres.start)
        elif fault.kind in ("kill-agent", "kill-replicator"):
            kind = fault.kind.removeprefix("kill-")
            for name in self._undo.pop(id(fault), []):
                await asyncio.to_thread(w.restart, w.regions[name], kind)
        elif fault.kind == "restart-kafka":
            await asyncio.to_thread(w.stack.kafka.start)
        elif fault.kind in ("limit-data", "reset-peer", "slicer", "reset-peer-0.3", "flap"):
            task = self._flappers.pop(id(fault), None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for proxy in self._agent_links():
                await w.toxi.clear(proxy)
            for region in w.regions.values():
                for proxy in region.links("kafka"):
                    await w.toxi.clear(proxy)
