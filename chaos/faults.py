"""Injectors: turn a scheduled `Fault` into actions on the world, and undo them.

Each `begin` returns what it actually did (the resolved target) for the run's
log; each `end` undoes exactly that. "owner" targets resolve, when the fault
begins, to the region owning most critical datasets then.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from chaos.nemesis import Fault
from chaos.workload import FencedWorkload, OwnerSampler
from chaos.world import ChaosWorld, signal_daemon
from controlplane.logs import get_logger

log = get_logger("meridian.chaos")


def stop_postgres_fast(world: ChaosWorld, timeout_s: float = 20.0) -> None:
    """Stop PostgreSQL in its *fast* mode (SIGINT: sessions are cut, as when a catalog
    host goes down). SIGTERM's smart mode would wait for every client to leave, which
    the controllers never do, so the fault would begin only after a long stall."""
    process = world.stack.postgres.process
    pid = process.pid()
    if pid is None:
        return
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
            signal_daemon(region.daemons["controller"], signal.SIGSTOP)
            self._undo[id(fault)] = [region.name]
            return f"SIGSTOP {region.name} controller"
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
        if fault.kind in ("cut-etcd", "cut-etcd-up", "cut-etcd-down", "isolate"):
            for region in w.regions.values():
                for link in region.proxies:
                    await w.toxi.clear(region.proxy_name(link))
        elif fault.kind == "sigstop":
            for name in self._undo.pop(id(fault), []):
                signal_daemon(w.regions[name].daemons["controller"], signal.SIGCONT)
                self.workload.regions[name].unpause()
        elif fault.kind in ("kill-etcd-leader", "etcd-quorum-loss"):
            cluster = w.stack.etcd_cluster()
            for i in self._undo.pop(id(fault), []):
                await asyncio.to_thread(cluster.members[int(i)].start)
            await asyncio.to_thread(cluster.wait_healthy, 60.0)
        elif fault.kind == "stop-catalog":
            await asyncio.to_thread(w.stack.postgres.start)
