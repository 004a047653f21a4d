"""Sequential read through the read-through cache across a slow link (issue 16,
*Benchmark*, last row): prefetch on against prefetch off, and against the link.

    python benchmarks/cache_bench.py                          # 40 x 4 MiB, 40 ms, 32 MiB/s
    python benchmarks/cache_bench.py --shards 200 --shard-kib 8192  # the issue's size

Real processes on the stack's etcd, Kafka and Toxiproxy (export the MERIDIAN_STACK_*
ports): eu-west holds dataset `cached/bench`; eu-north (no replica, a cache) reaches
eu-west's agent only through a Toxiproxy proxy adding `rtt/2` each way and a bandwidth
cap. A reader walks the shards in key order through eu-north's agent, once with the
agent started with prefetch (MERIDIAN_CACHE_PREFETCH=8) and once without (0); each
start begins with an empty cache. "link" is one cold read of a single object as large
as `--link-mib` through the same proxy (one stream, its round trips amortised).
Toxiproxy's cap applies per connection, and each fill is a Sync on a connection of its
own, so parallel prefetch fills may together exceed the one-stream figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import bench_harness  # noqa: F401 - puts tests/ on the path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cache"))

from cache_world import get, prepare_cache_world, put
from harness.agent_process import AgentProcess

from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.loopback import free_port
from controlplane.settings import load_settings

MiB = 1 << 20
PROXY = "cache-bench-west"


async def walk(address: str, keys: list[str], size: int) -> float:
    """Seconds to read every key in order through the agent at `address`."""
    start = time.perf_counter()
    for key in keys:
        _, data = await get(address, "cached/bench", key)
        if len(data) != size:
            raise RuntimeError(f"{key}: {len(data)} bytes, not {size}")
    return time.perf_counter() - start


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--shard-kib", type=int, default=4096)
    parser.add_argument("--rtt-ms", type=int, default=40)
    parser.add_argument("--rate-mib", type=int, default=32, help="the proxy's cap, MiB/s")
    parser.add_argument("--link-mib", type=int, default=64)
    args = parser.parse_args()
    base = load_settings()
    etcd = f"127.0.0.1:{base.stack_etcd_port}"
    kafka = f"127.0.0.1:{base.stack_kafka_port}"
    faults = ToxiproxyClient(f"http://127.0.0.1:{base.stack_toxiproxy_port}")
    size = args.shard_kib << 10
    total_mib = args.shards * size / MiB
    limit = int((total_mib + 2 * args.link_mib) * MiB)
    with tempfile.TemporaryDirectory(prefix="cache-bench-") as tmp:
        folder = Path(tmp)
        env = prepare_cache_world(folder / "world", etcd, kafka, f"eu-north={limit}")
        west = AgentProcess("eu-west", folder / "west", env, folder / "west.log")
        west.start(timeout_s=60)
        north: AgentProcess | None = None
        try:
            port = free_port()
            faults.create_proxy(PROXY, f"127.0.0.1:{port}", west.address)
            keys = [f"shard-{n:05d}" for n in range(args.shards)]
            for key in keys:
                await put(west.address, "cached/bench", key, os.urandom(size))
            await put(west.address, "cached/bench", "~link", os.urandom(args.link_mib * MiB))
            faults.add_latency(PROXY, args.rtt_ms // 2)
            faults.add_bandwidth(PROXY, args.rate_mib * 1024)
            seconds: dict[str, float] = {}
            for mode, depth in (("on", "8"), ("off", "0")):
                north_env = {
                    **env,
                    "MERIDIAN_AGENT_ROUTES": f"eu-west=127.0.0.1:{port}",
                    "MERIDIAN_CACHE_PREFETCH": depth,
                    "MERIDIAN_CACHE_FRESH_S": "600",
                }
                north = AgentProcess(
                    "eu-north", folder / f"north-{mode}", north_env, folder / f"north-{mode}.log"
                )
                north.start(timeout_s=60)
                if north.wait_event("cache_changelog_current", 90) is None:
                    raise RuntimeError(f"the cache never read the change log: {north.log_tail()}")
                if mode == "on":
                    start = time.perf_counter()
                    _, _data = await get(north.address, "cached/bench", "~link")
                    seconds["link"] = time.perf_counter() - start
                seconds[mode] = await walk(north.address, keys, size)
                north.stop()
                north = None
        finally:
            if north is not None:
                north.stop()
            west.stop()
            faults.delete_proxy(PROXY)
    link = args.link_mib / seconds["link"]
    on, off = total_mib / seconds["on"], total_mib / seconds["off"]
    print(
        f"\nsequential read of {args.shards} x {args.shard_kib} KiB through the cache, "
        f"{args.rtt_ms} ms RTT, proxy cap {args.rate_mib} MiB/s per connection\n"
    )
    print("| measure | result | target |")
    print("| --- | --- | --- |")
    print(f"| link, one stream ({args.link_mib} MiB cold) | {link:.1f} MiB/s | |")
    print(
        f"| prefetch on | {on:.1f} MiB/s ({seconds['on']:.2f} s), {on / link:.2f}x the link "
        "| >= 0.8x the link |"
    )
    print(f"| prefetch off | {off:.1f} MiB/s ({seconds['off']:.2f} s) | |")
    print(f"| on / off | {seconds['off'] / seconds['on']:.2f}x faster | >= 5x |")
    # Why 5x is out of reach here: a read that misses pays at least one round trip
    # beside its bytes, so no prefetch can beat (bytes/link + rtt) / (bytes/link).
    shard_s = size / MiB / link
    beyond_ms = (seconds["off"] / args.shards - shard_s) * 1000
    print(
        f"| prefetch off, per shard beyond its bytes at the link's speed | {beyond_ms:.0f} ms "
        f"({beyond_ms / args.rtt_ms:.1f} round trips) | |"
    )
    print(
        "| the most prefetch can gain over reads paying one round trip each | "
        f"{(shard_s + args.rtt_ms / 1000) / shard_s:.2f}x | |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
