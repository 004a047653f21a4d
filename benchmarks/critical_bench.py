"""Acked critical Put latency (issue 13), one table with the ratio to a plain local Put:

    python benchmarks/critical_bench.py                 # 1 MiB and 64 MiB, 10 ms RTT link
    python benchmarks/critical_bench.py --quick         # a smoke run

Three real agent processes (eu-west the owner, eu-central and eu-north replicas) of
the critical world of tests/critical/critical_helpers.py, on the stack's etcd. Cases:
`pair/*` (one replica, `ack: quorum` = 2 of 2) and `every/*` (two replicas, `ack:
all`), on loopback and with the owner reaching each replica through a Toxiproxy
proxy adding half the RTT each way (MERIDIAN_AGENT_ROUTES). The baseline is a Put
of a standard dataset on the same owner agent (acked after its local commit).
Each Put is a new object of random bytes (no basis on the replica: pushed whole).

Needs the stack (`meridian stack up`): etcd and Toxiproxy on the MERIDIAN_STACK_* ports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "critical"), str(HERE.parent / "tests")]

from critical_helpers import prepare_critical_world, put  # noqa: E402
from harness.agent_fixtures import clear_keyspace  # noqa: E402
from harness.agent_process import AgentProcess  # noqa: E402

from controlplane.adapters.etcd import EtcdCoordination  # noqa: E402
from controlplane.adapters.toxiproxy import ToxiproxyClient  # noqa: E402
from controlplane.coordination.protocols.ownership import Ownership  # noqa: E402
from controlplane.settings import load_settings  # noqa: E402

MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def claim_all(etcd: str, datasets: list[str]) -> None:
    coord = EtcdCoordination([etcd], timeout_s=5.0)
    await coord.connect()
    try:
        own = Ownership(coord)
        for ds in datasets:
            await own.claim(ds, "eu-west", expect_epoch=0, reason="home", actor="bench")
    finally:
        await coord.close()


async def latencies(address: str, dataset: str, size: int, runs: int) -> list[float]:
    out: list[float] = []
    for n in range(runs):
        data = os.urandom(size)
        started = time.perf_counter()
        await put(address, dataset, f"obj-{n}", data, timeout_s=120)
        out.append(time.perf_counter() - started)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    west: AgentProcess, sizes: list[int], runs: dict[int, int], link: str, tag: str
) -> list[tuple[str, str, int, float, float, float]]:
    rows = []
    for size in sizes:
        base = await latencies(west.address, f"plain/{tag}-{size}", size, runs[size])
        base_p50 = statistics.median(base)
        rows.append((link, "local (standard)", size, base_p50, pct(base, 0.99), 1.0))
        for case, ds in (("1 replica, quorum", "pair"), ("2 replicas, all", "every")):
            got = await latencies(west.address, f"{ds}/{tag}-{size}", size, runs[size])
            p50 = statistics.median(got)
            rows.append((link, case, size, p50, pct(got, 0.99), p50 / base_p50))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rtt-ms", type=int, default=10)
    args = parser.parse_args()
    settings = load_settings()
    etcd = f"127.0.0.1:{settings.stack_etcd_port}"
    sizes = [MiB, 64 * MiB] if not args.quick else [MiB, 8 * MiB]
    runs = {MiB: 5 if args.quick else 40, 8 * MiB: 3, 64 * MiB: 8}
    clear_keyspace(etcd)
    with tempfile.TemporaryDirectory(prefix="crit-bench-") as tmp:
        root = Path(tmp)
        env = prepare_critical_world(root / "world", etcd)
        tags = ("lo", "wan")
        datasets = [f"{ds}/{t}-{s}" for ds in ("pair", "every") for t in tags for s in sizes]
        asyncio.run(claim_all(etcd, datasets))
        procs = {
            r: AgentProcess(r, root / r, dict(env), root / f"{r}.log", lease_ttl_s=10)
            for r in ("eu-west", "eu-central", "eu-north")
        }
        toxi = ToxiproxyClient(f"http://127.0.0.1:{settings.stack_toxiproxy_port}", timeout_s=5)
        proxies: list[str] = []
        try:
            procs["eu-central"].start()
            procs["eu-north"].start()
            west = procs["eu-west"].start()
            rows = asyncio.run(measure(west, sizes, runs, "loopback", "lo"))
            west.stop()
            routes = []
            for region in ("eu-central", "eu-north"):
                name, port = f"crit-bench-{region}", free_port()
                toxi.create_proxy(name, f"127.0.0.1:{port}", procs[region].address)
                toxi.add_latency(name, args.rtt_ms // 2)
                proxies.append(name)
                routes.append(f"{region}=127.0.0.1:{port}")
            west.env["MERIDIAN_AGENT_ROUTES"] = ",".join(routes)
            west.start()
            rows += asyncio.run(measure(west, sizes, runs, f"{args.rtt_ms} ms RTT", "wan"))
        finally:
            for name in proxies:
                toxi.delete_proxy(name)
            for proc in procs.values():
                if proc.running:
                    proc.stop()
    print(f"{'link':<12} {'case':<20} {'size':>7} {'p50 ms':>9} {'p99 ms':>9} {'p50/local':>9}")
    for link, case, size, p50, p99, ratio in rows:
        print(
            f"{link:<12} {case:<20} {size // MiB:>5}Mi {p50 * 1e3:>9.1f} {p99 * 1e3:>9.1f} "
            f"{ratio:>9.2f}"
        )
    print(f"runs per case: {', '.join(f'{s // MiB} MiB x{runs[s]}' for s in sizes)}")


if __name__ == "__main__":
    main()
