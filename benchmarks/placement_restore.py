"""Time to restore `r` copies after an agent dies (issue 16, *Benchmark*, third row).

    python benchmarks/placement_restore.py                       # 2,000 objects of 1 MiB
    python benchmarks/placement_restore.py --objects 1000 --size 262144
    python benchmarks/placement_restore.py --lease-ttl 2 --no-fast-fail   # the lease alone

Four real agents of one region (lease TTL `--lease-ttl`, the agent's default 5 s) on
the stack's etcd (MERIDIAN_STACK_ETCD_PORT; `meridian stack up`), `--objects` objects
of `--size` bytes written through one of them (r = 2), the in-region throughput
measured by one agent pulling a 64 MiB object from another, then one agent
SIGKILLed: the time until every object it held is again on 2 agents of the
surviving three, against the target 2 s + bytes moved / the measured throughput.
Printed apart: detection (until its registration went: a peer's fast-fail report,
agents/placement/fastfail.py, or the lease lapsing), the move phase after it (and its
throughput), the survivors' rebalance passes from their logs, and the load average.
The restore instant is the end of the last survivor's pass (its log), checked once by
listing every survivor's objects: listing them over and over while they move would
take the CPU the move needs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "placement"), str(HERE.parent / "tests")]

from harness.agent_fixtures import clear_keyspace  # noqa: E402
from harness.agent_process import AgentProcess, prepare_world  # noqa: E402
from region_harness import RegionOfAgents, copies, local_objects  # noqa: E402

from agents.client import AgentClient  # noqa: E402
from agents.routing.peers import ROUTED_KEY  # noqa: E402
from controlplane.adapters.etcd import EtcdCoordination  # noqa: E402
from controlplane.coordination.protocols import keys  # noqa: E402
from meridian.convert import version_to_wire  # noqa: E402
from meridian.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402

DATASET = "corpus/a"


_BLOCK = os.urandom(1 << 20)


async def blob(size: int, seed: int) -> AsyncIterator[bytes]:
    """`size` bytes, distinct per `seed` (its first 8 bytes)."""
    left, first = size, True
    while left > 0:
        part = _BLOCK[: min(left, len(_BLOCK))]
        if first:
            part = (seed.to_bytes(8, "little") + part[8:])[: len(part)]
            first = False
        left -= len(part)
        yield part


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--lease-ttl", type=int, default=5, help="the agents' lease TTL, s")
    ap.add_argument(
        "--no-fast-fail", action="store_true", help="MERIDIAN_FAST_FAIL_ON_REFUSED=false"
    )
    args = ap.parse_args()
    etcd = f"127.0.0.1:{os.environ.get('MERIDIAN_STACK_ETCD_PORT', '2379')}"
    with tempfile.TemporaryDirectory(prefix="placement-restore-") as tmp:
        folder = Path(tmp)
        clear_keyspace(etcd)
        env = prepare_world(folder / "world", etcd)
        env["MERIDIAN_KAFKA"] = "127.0.0.1:1"
        if args.no_fast_fail:
            env["MERIDIAN_FAST_FAIL_ON_REFUSED"] = "false"
        region = RegionOfAgents(folder / "region", env, lease_ttl_s=args.lease_ttl)
        try:
            await run(region, args.objects, args.size)
        finally:
            region.stop_all()
            clear_keyspace(etcd)


async def run(region: RegionOfAgents, objects: int, size: int) -> None:
    region.add(4)
    await region.wait_members(4)
    entry = region.agents[0]
    names = [f"obj-{i:05d}" for i in range(objects)]
    t = time.monotonic()
    async with AgentClient(entry.address, timeout_s=120) as client:
        gate = asyncio.Semaphore(8)

        async def put(i: int, key: str) -> None:
            async with gate:
                await client.put(DATASET, key, blob(size, i + 1))

        await asyncio.gather(*(put(i, k) for i, k in enumerate(names)))
        write_s = time.monotonic() - t
        # In-region throughput: one agent pulls a 64 MiB object from a holder.
        big = 64 << 20
        await client.put("corpus/b", "throughput", blob(big, 0))
    where = copies(await region.holdings())
    holders = where[("corpus/b", "throughput")]
    source = next(p for p in region.agents if region.agent_id(p) in holders)
    target = next(p for p in region.agents if region.agent_id(p) not in holders)
    async with AgentClient(source.address) as peer:
        stat = await peer.stat("corpus/b", "throughput")
    async with grpc.aio.insecure_channel(target.address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        t = time.monotonic()
        await stub.Fetch(
            agent_pb2.FetchRequest(
                dataset="corpus/b",
                key="throughput",
                version=version_to_wire(stat.version),
                sources=[agent_pb2.FetchSource(region="eu-west", address=source.address)],
            ),
            metadata=((ROUTED_KEY, "bench"),),
            timeout=300,
        )
        throughput = big / (time.monotonic() - t)
    before = copies(await region.holdings())
    victim = region.agents[3]
    victim_id = region.agent_id(victim)
    # Everything it held moves, the 64 MiB throughput object too when it was a holder.
    lost = {n for n, w in before.items() if victim_id in w}
    lost_bytes = sum(big if n == ("corpus/b", "throughput") else size for n in lost)
    load_before = os.getloadavg()
    # The survivors that hold a lost object push it to its new owner; each one's pass
    # ends (rebalance_finished, left 0) once every object it pushed is held there.
    senders = [
        p
        for p in region.live()
        if p is not victim and any(region.agent_id(p) in before[n] for n in lost)
    ]
    etcd = EtcdCoordination([region.env["MERIDIAN_ETCD"]], timeout_s=5.0)
    await etcd.connect()
    prefix = keys.agents_of(region.region)
    killed_wall = time.time()
    killed = time.monotonic()
    victim.kill()
    detected = None
    restored = None
    try:
        for _ in range(100_000):  # detection: one etcd read every 10 ms
            kvs, _rev = await etcd.get_prefix(prefix)
            if not any(kv.key.endswith("/" + victim_id) for kv in kvs):
                detected = time.monotonic() - killed
                break
            if time.monotonic() - killed > 600:
                break
            await asyncio.sleep(0.01)
    finally:
        await etcd.close()
    # The move: read from the senders' logs (listing every agent's objects while they
    # move would take CPU from the move), then checked once with a listing.
    for _ in range(12_000):
        if detected is None or time.monotonic() - killed > 600:
            break
        ends = [settled_at(p, killed_wall) for p in senders]
        if all(e is not None for e in ends) and await restored_everywhere(region, lost):
            restored = max(e for e in ends if e is not None) - killed_wall
            break
        await asyncio.sleep(0.1)
    load_after = os.getloadavg()
    passes = survivor_passes(region, killed_wall)
    moved_s = restored - detected if restored is not None and detected is not None else None
    target_s = 2.0 + lost_bytes / throughput
    mib = 2**20
    rows = [
        ("objects written (r=2)", f"{objects:,} x {size:,} B in {write_s:.1f} s", ""),
        ("in-region throughput (one 64 MiB pull)", f"{throughput / mib:.0f} MiB/s", ""),
        ("objects the killed agent held", f"{len(lost):,} ({lost_bytes / mib:.0f} MiB)", ""),
        (
            "detection (its registration gone)",
            f"{detected:.2f} s" if detected is not None else "never",
            f"lease TTL {region.lease_ttl_s} s; {marked_by(region, victim_id)}",
        ),
        (
            "move phase (detection to r copies)",
            f"{moved_s:.2f} s" if moved_s is not None else "-",
            f"{lost_bytes / mib / moved_s:.0f} MiB/s; moved/throughput = "
            f"{lost_bytes / throughput:.2f} s"
            if moved_s
            else "",
        ),
        ("survivors' rebalance passes (from their logs)", passes, ""),
        (
            "time to restore r copies after SIGKILL",
            f"{restored:.2f} s" if restored else "not within 600 s",
            f"<= 2 s + moved/throughput = {target_s:.2f} s "
            + ("(held)" if restored and restored <= target_s else "(NOT held)"),
        ),
        (
            "load average (1 min) before / after the kill",
            f"{load_before[0]:.1f} / {load_after[0]:.1f}",
            f"{os.cpu_count()} cores",
        ),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, width, strict=True)))


def settled_at(proc: AgentProcess, since_wall: float) -> float | None:
    """When `proc`'s last pass since `since_wall` ended with nothing left (unix time)."""
    last = None
    for e in proc.events():
        if e.get("event") == "rebalance_finished" and _at(e) >= since_wall:
            last = _at(e) if e.get("left") == 0 else None
    return last


async def restored_everywhere(region: RegionOfAgents, lost: set[tuple[str, str]]) -> bool:
    held: dict[tuple[str, str], set[str]] = {}
    for proc in region.live():
        for name in await local_objects(proc.address):
            held.setdefault(name, set()).add(region.agent_id(proc))
    return all(len(held.get(n, set())) >= 2 for n in lost)


def _at(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def marked_by(region: RegionOfAgents, victim_id: str) -> str:
    """Which survivors marked the victim down, and how long after their watch broke."""
    found = [
        f"{region.agent_id(p)[-4:]} after {e.get('after_s')} s"
        for p in region.live()
        for e in p.events()
        if e.get("event") == "peer_marked_down" and e.get("agent") == victim_id
    ]
    return "marked down by " + ", ".join(found) if found else "by the lease"


def survivor_passes(region: RegionOfAgents, since_wall: float) -> str:
    """Each survivor's passes after the kill: seconds from the kill to start and end,
    and the bytes it moved."""
    out = []
    for proc in region.live():
        started = [
            e
            for e in proc.events()
            if e.get("event") == "rebalance_started" and _at(e) >= since_wall
        ]
        ended = [
            e
            for e in proc.events()
            if e.get("event") == "rebalance_finished" and _at(e) >= since_wall
        ]
        if not started or not ended:
            out.append(f"{region.agent_id(proc)[-4:]}: none")
            continue
        moved = sum(int(str(e.get("moved_bytes", 0))) for e in ended)
        out.append(
            f"{region.agent_id(proc)[-4:]}: {_at(started[0]) - since_wall:.2f}"
            f"-{_at(ended[-1]) - since_wall:.2f} s, {moved / 2**20:.0f} MiB"
        )
    return "; ".join(out)


if __name__ == "__main__":
    asyncio.run(main())
