"""Time to restore `r` copies after an agent dies (issue 16, *Benchmark*, third row).

    python benchmarks/placement_restore.py                       # 2,000 objects of 1 MiB
    python benchmarks/placement_restore.py --objects 2000 --size 65536

Four real agents of one region (lease TTL 2 s) on the stack's etcd
(MERIDIAN_STACK_ETCD_PORT; `meridian stack up`), `--objects` objects of `--size`
bytes written through one of them (r = 2), the in-region throughput measured by one
agent pulling a 64 MiB object from another, then one agent SIGKILLed: the time until
every object it held is again on 2 agents of the surviving three (its lease lapsing
included), against the target 2 s + bytes moved / the measured throughput. Also
printed: when its registration went (detection) and the bytes the survivors moved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "placement"), str(HERE.parent / "tests")]

from harness.agent_fixtures import clear_keyspace  # noqa: E402
from harness.agent_process import prepare_world  # noqa: E402
from region_harness import RegionOfAgents, copies, local_objects  # noqa: E402

from agents.client import AgentClient  # noqa: E402
from agents.routing.peers import ROUTED_KEY  # noqa: E402
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
    args = ap.parse_args()
    etcd = f"127.0.0.1:{os.environ.get('MERIDIAN_STACK_ETCD_PORT', '2379')}"
    with tempfile.TemporaryDirectory(prefix="placement-restore-") as tmp:
        folder = Path(tmp)
        clear_keyspace(etcd)
        env = prepare_world(folder / "world", etcd)
        env["MERIDIAN_KAFKA"] = "127.0.0.1:1"
        region = RegionOfAgents(folder / "region", env)
        try:
            await run(region, args.objects, args.size)
        finally:
            region.stop_all()
            clear_keyspace(etcd)


async def run(region: RegionOfAgents, objects: int, size: int) -> None:
    region.add(4)
    await region.wait_members(4)
    entry = region.agents[0]
    keys = [f"obj-{i:05d}" for i in range(objects)]
    t = time.monotonic()
    async with AgentClient(entry.address, timeout_s=120) as client:
        gate = asyncio.Semaphore(8)

        async def put(i: int, key: str) -> None:
            async with gate:
                await client.put(DATASET, key, blob(size, i + 1))

        await asyncio.gather(*(put(i, k) for i, k in enumerate(keys)))
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
    lost = {n for n, w in before.items() if victim_id in w and n[0] == DATASET}
    lost_bytes = len(lost) * size
    killed = time.monotonic()
    victim.kill()
    detected = None
    restored = None
    for _ in range(100_000):
        now = time.monotonic()
        if detected is None and victim_id not in await region.registrations():
            detected = now - killed
        if detected is not None:
            held: dict[tuple[str, str], set[str]] = {}
            for proc in region.live():
                for name in await local_objects(proc.address, DATASET):
                    held.setdefault(name, set()).add(region.agent_id(proc))
            if all(len(held.get(n, set())) >= 2 for n in lost):
                restored = time.monotonic() - killed
                break
        if now - killed > 600:
            break
        await asyncio.sleep(0.05)
    target_s = 2.0 + lost_bytes / throughput
    rows = [
        ("objects written (r=2)", f"{objects:,} x {size:,} B in {write_s:.1f} s", ""),
        ("in-region throughput (one 64 MiB pull)", f"{throughput / 2**20:.0f} MiB/s", ""),
        ("objects the killed agent held", f"{len(lost):,} ({lost_bytes / 2**20:.0f} MiB)", ""),
        ("its lease lapsed (detection)", f"{detected:.2f} s" if detected else "never", ""),
        (
            "time to restore r copies after SIGKILL",
            f"{restored:.2f} s" if restored else "not within 600 s",
            f"<= 2 s + moved/throughput = {target_s:.2f} s "
            + ("(held)" if restored and restored <= target_s else "(NOT held)"),
        ),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, width, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
