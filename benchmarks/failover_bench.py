"""Failover benchmark: SIGKILL the controller of a region owning N critical datasets.

Each trial starts `meridian controller run` for eu-west (home of every dataset),
with eu-central and eu-north already running, waits until eu-west owns all N,
SIGKILLs it, and measures the time from the kill until every dataset has a new
owner. Ownership is sampled every 20 ms and each controller writes a fenced
canary for what it owns, so split brain (an epoch going back, two owners for one
epoch, a stale write accepted) is counted, not assumed. Then a planned switchover
of one caught-up dataset is timed, repeatedly.

Runs twice: on loopback, and with a 100 ms round trip between the controllers and
etcd injected by Toxiproxy (the stack's Toxiproxy; etcd's heartbeat and election
timeout then set per etcd's tuning guide for that RTT: 150 ms / 1500 ms).

    python benchmarks/failover_bench.py                 # 20 trials x 100 datasets, both runs
    python benchmarks/failover_bench.py --trials 2 --datasets 10 --no-wan   # a quick look

Needs the etcd binary (the stack's) and, for the WAN run, the stack's Toxiproxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_harness import ControllerProcess, epoch_violations, prepare_catalog, split_brain

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.coordination.orchestration.runbooks import Runbooks
from controlplane.coordination.protocols.fencing import DirectoryEpochs
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.logs import configure_logging
from controlplane.loopback import free_block, free_port
from controlplane.settings import load_settings
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster

PATRONI_TTL_S = 30


@dataclass
class RunResult:
    scenario: str
    ttl_s: int
    datasets: int
    failover_s: list[float] = field(default_factory=list)
    switchover_s: list[float] = field(default_factory=list)
    split_brain: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            ordered = sorted(xs)
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        return {
            "scenario": self.scenario,
            "trials": len(self.failover_s),
            "datasets": self.datasets,
            "ttl_s": self.ttl_s,
            "failover_p50_s": statistics.median(self.failover_s) if self.failover_s else None,
            "failover_p95_s": pct(self.failover_s, 0.95),
            "failover_max_s": max(self.failover_s) if self.failover_s else None,
            "split_brain": self.split_brain,
            "switchover_p50_s": statistics.median(self.switchover_s) if self.switchover_s else None,
            "switchover_p95_s": pct(self.switchover_s, 0.95),
        }


CLUSTER_OFFSETS = (0, 1, 10, 11, 20, 21)  # client and peer port of each of 3 members


def start_cluster(
    base: Path, port: int, heartbeat_ms: int | None, election_ms: int | None
) -> EtcdCluster:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return start_etcd_cluster(
            base,
            members=3,
            client_port=port,
            peer_port=port + 1,
            heartbeat_ms=heartbeat_ms,
            election_ms=election_ms,
        )


async def wait_for(
    pred: Callable[[], Awaitable[bool]], timeout_s: float, step_s: float = 0.01
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await pred():
            return True
        await asyncio.sleep(step_s)
    return bool(await pred())


async def run_scenario(
    name: str,
    cluster: EtcdCluster,
    controller_etcd: list[str],
    work: Path,
    args: argparse.Namespace,
) -> RunResult:
    result = RunResult(name, args.ttl, args.datasets)
    env = prepare_catalog(work / "world", cluster.endpoints, args.datasets, manual=0)
    ctl_env = {**env, "MERIDIAN_ETCD": ",".join(controller_etcd), "MERIDIAN_LOG_LEVEL": "warning"}
    datasets = [f"ckpt/d{i:03d}" for i in range(args.datasets)]
    fence = work / "fence"
    async with EtcdCoordination(cluster.endpoints, timeout_s=5) as coord:
        own = Ownership(coord)

        async def owners() -> dict[str, str]:
            return {d: o.region for d, o in (await own.list()).items()}

        async def all_owned(pred: Callable[[str | None], bool]) -> bool:
            o = await owners()
            return all(pred(o.get(d)) for d in datasets)

        standing = [
            ControllerProcess(r, ctl_env, work / f"{r}.log", fence, lease_ttl_s=args.ttl).start()
            for r in ("eu-central", "eu-north")
        ]
        try:
            for trial in range(args.trials):
                await coord.delete("/meridian/owners/", prefix=True)
                west = ControllerProcess(
                    "eu-west", ctl_env, work / f"west-{trial}.log", fence, lease_ttl_s=args.ttl
                ).start()
                if not await wait_for(lambda: all_owned(lambda r: r == "eu-west"), 60, 0.05):
                    raise RuntimeError(f"trial {trial}: eu-west did not claim every dataset")
                samples: list[dict[str, tuple[str, int]]] = []

                sampler = asyncio.create_task(sample_owners(own, samples))
                await asyncio.sleep(1.0)  # canaries at eu-west's epochs
                west.kill()
                killed = time.monotonic()
                moved = await wait_for(
                    lambda: all_owned(lambda r: r not in (None, "eu-west")), 4 * args.ttl + 10
                )
                elapsed = time.monotonic() - killed
                await asyncio.sleep(0.5)
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                if not moved:
                    result.violations.append(f"trial {trial}: not every dataset moved")
                result.failover_s.append(elapsed)
                bad = epoch_violations(samples) + split_brain(DirectoryEpochs(fence).read_log())
                result.split_brain += len(bad)
                result.violations += bad[:5]
                print(f"  {name} trial {trial + 1}/{args.trials}: {elapsed:.2f} s", file=sys.stderr)

            # Planned switchovers of one caught-up dataset, through the runbook API,
            # over the same path to etcd as the controllers.
            await coord.delete("/meridian/owners/", prefix=True)
            west = ControllerProcess(
                "eu-west", ctl_env, work / "west-sw.log", fence, lease_ttl_s=args.ttl
            ).start()
            standing.append(west)
            if not await wait_for(lambda: all_owned(lambda r: r == "eu-west"), 60, 0.05):
                raise RuntimeError("eu-west did not claim every dataset")
            catalog = CatalogBridge.open(env["MERIDIAN_CATALOG"])
            try:
                async with EtcdCoordination(controller_etcd, timeout_s=5) as op:
                    rb = Runbooks(op, catalog, catalog, catalog, actor="bench")
                    try:
                        for k in range(min(args.switchovers, len(datasets))):
                            t0 = time.monotonic()
                            plan, _ = await rb.plan_switchover(datasets[k], "eu-central")
                            await rb.run_switchover(plan.moves[0], reason="bench", timeout_s=10)
                            result.switchover_s.append(time.monotonic() - t0)
                    finally:
                        await rb.close()  # revokes the lease its handover marks lived on
            finally:
                catalog.close()
        finally:
            for p in standing:
                p.stop()
            await coord.delete("/meridian/", prefix=True)
    return result


async def sample_owners(own: Ownership, into: list[dict[str, tuple[str, int]]]) -> None:
    """Every owner and epoch, every 20 ms, until cancelled."""
    while True:
        listed = await own.list()
        into.append({d: (o.region, o.epoch) for d, o in listed.items()})
        await asyncio.sleep(0.02)


def _seconds(value: object) -> str:
    return f"{value:.2f} s" if isinstance(value, float) else "-"


def table(results: list[RunResult]) -> str:
    lines = [
        "| scenario | trials x datasets | lease TTL | failover p50 | p95 | max | split brain "
        "| planned switchover p50 | p95 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        s = r.summary()
        f = {k: _seconds(v) for k, v in s.items()}.__getitem__
        lines.append(
            f"| {r.scenario} | {s['trials']} x {r.datasets} | {r.ttl_s} s | {f('failover_p50_s')} "
            f"| {f('failover_p95_s')} | {f('failover_max_s')} | {r.split_brain} "
            f"| {f('switchover_p50_s')} | {f('switchover_p95_s')} |"
        )
    patroni = f"| Patroni default (for scale) | - | {PATRONI_TTL_S} s | - | reported RTO 20-30 s |"
    lines.append(patroni + " - | - | - | - |")
    lines.append("")
    lines.append("targets: failover p95 <= TTL + 1 s; split brain 0; planned switchover p95 <= 1 s")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[RunResult]:
    results: list[RunResult] = []
    root = Path(tempfile.mkdtemp(prefix="failover-bench-"))
    try:
        if not args.no_loopback:
            cluster = start_cluster(root / "etcd-lo", free_block(CLUSTER_OFFSETS), None, None)
            try:
                results.append(
                    await run_scenario("loopback", cluster, cluster.endpoints, root / "lo", args)
                )
            finally:
                cluster.stop()
        if not args.no_wan:
            cluster = start_cluster(root / "etcd-wan", free_block(CLUSTER_OFFSETS), 150, 1500)
            toxi = ToxiproxyClient(load_settings().toxiproxy, timeout_s=5)
            names: list[str] = []
            try:
                proxied: list[str] = []
                for i, ep in enumerate(cluster.endpoints):
                    name = f"bench-etcd-{i}"
                    listen = f"127.0.0.1:{free_port()}"
                    toxi.create_proxy(name, listen, ep)
                    toxi.add_latency(name, args.rtt_ms // 2)
                    names.append(name)
                    proxied.append(listen)
                results.append(
                    await run_scenario(
                        f"{args.rtt_ms} ms RTT (Toxiproxy)", cluster, proxied, root / "wan", args
                    )
                )
            finally:
                for name in names:
                    toxi.delete_proxy(name)
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--ttl", type=int, default=5, help="lease TTL in seconds")
    parser.add_argument("--switchovers", type=int, default=20)
    parser.add_argument("--rtt-ms", type=int, default=100)
    parser.add_argument("--no-wan", action="store_true", help="skip the Toxiproxy run")
    parser.add_argument("--no-loopback", action="store_true", help="skip the loopback run")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    configure_logging("warning")
    results = asyncio.run(main_async(args))
    print(table(results))
    if args.json:
        args.json.write_text(
            json.dumps([{**r.summary(), "raw": asdict(r)} for r in results], indent=2)
        )
    failed = any(r.violations for r in results)
    for r in results:
        for v in r.violations:
            print(f"violation ({r.scenario}): {v}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
