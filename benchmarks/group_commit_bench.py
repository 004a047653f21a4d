"""Group commit benchmark: single 1 KiB writes into the agent's store from 1, 8 and 32
concurrent writers, group commit off and on, in one run.

    python benchmarks/group_commit_bench.py                 # 3 rounds x 2,000 writes a cell
    python benchmarks/group_commit_bench.py --writes 500 --rounds 1   # a smoke run

Each writer is a thread calling the store's blocking API, as the daemon's
`asyncio.to_thread` does: `put` of a new object with its change event (a standard
write: `outbox=True`), or `apply` of a version made elsewhere (a replicator's or a
replica's write). Every call returns once its write is durable (file, folder and
SQLite commit with synchronous=FULL), on or off. Off: each write fsyncs its file and
folder and commits its own transaction. On: concurrent writes share the folder
fsyncs and one transaction (agents/store/group.py).

Each store starts with every fan-out folder made (the steady state of a store that
has held a few thousand objects: no write creates a folder). The cells run in
interleaved rounds (the machine is shared, so its load drifts); the table gives the
median round's throughput and the latency percentiles of all rounds' writes, and
the mean number of writes per group.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from agents.store import ObjectStore
from agents.store.names import OBJECTS
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version

KiB = 1024
WRITERS = (1, 8, 32)
MODES = ("off", "on")
KINDS = ("put", "apply")


@dataclass
class Cell:
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    groups: int = 0
    writes: int = 0


def fresh_root(parent: Path, name: str) -> Path:
    """A store root whose 4,096 fan-out folders exist already, made durable."""
    root = parent / name
    objects = root / OBJECTS
    objects.mkdir(parents=True)
    for n in range(4096):
        (objects / f"{n:03x}").mkdir()
    subprocess.run(["sync", "-f", str(objects)], check=True)
    return root


def run_cell(
    store: ObjectStore, kind: str, writers: int, writes: int, tag: str, data: bytes
) -> tuple[float, list[float]]:
    """`writes` single writes split among `writers` threads; returns writes/s and each
    write's latency in seconds."""
    per = max(1, writes // writers)
    digest = Digest.of(data)
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []
    start_gate = threading.Barrier(writers + 1)

    def writer(n: int) -> None:
        mine = latencies[n]
        try:
            start_gate.wait()
            for i in range(per):
                key = f"{tag}/w{n}/{i}"
                began = time.perf_counter()
                if kind == "put":
                    store.put("bench", key, [data], outbox=True)
                else:
                    hlc = HLC(time.time_ns() // 1_000_000, i, "us-east")
                    store.apply("bench", key, Version.put(hlc, len(data), digest), [data])
                mine.append(time.perf_counter() - began)
        except Exception as err:  # noqa: BLE001 - re-raised by the main thread
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    start_gate.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return per * writers / elapsed, [x for xs in latencies for x in xs]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000, help="writes per cell and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--kinds", default=",".join(KINDS), help="put,apply")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    data = os.urandom(KiB)
    work = Path(tempfile.mkdtemp(prefix="group-commit-bench-", dir=args.dir))
    cells: dict[tuple[str, int, str], Cell] = {}
    stores: dict[str, ObjectStore] = {}
    try:
        for mode in MODES:
            stores[mode] = ObjectStore(
                fresh_root(work, mode), clock=HybridClock("eu-west"), group_commit=mode == "on"
            )
        for rnd in range(args.rounds):
            for kind in kinds:
                for writers in WRITERS:
                    for mode in MODES:
                        store = stores[mode]
                        before = store.group_stats()
                        rate, lat = run_cell(
                            store, kind, writers, args.writes, f"r{rnd}-{kind}-{writers}", data
                        )
                        after = store.group_stats()
                        cell = cells.setdefault((kind, writers, mode), Cell())
                        cell.rates.append(rate)
                        cell.latencies += lat
                        cell.groups += after.groups - before.groups
                        cell.writes += after.items - before.items
    finally:
        for store in stores.values():
            store.close()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"store single writes of 1 KiB, durable on return; median of {args.rounds} round(s) "
        f"of {args.writes} writes; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    header = (
        "write", "writers", "group commit", "writes/s", "p50 ms", "p99 ms",
        "writes/group", "on ÷ off",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for kind in kinds:
        for writers in WRITERS:
            off = statistics.median(cells[(kind, writers, "off")].rates)
            for mode in MODES:
                cell = cells[(kind, writers, mode)]
                rate = statistics.median(cell.rates)
                per_group = f"{cell.writes / cell.groups:.1f}" if cell.groups else "1 (none)"
                p50, p99 = pct(cell.latencies, 0.5) * 1e3, pct(cell.latencies, 0.99) * 1e3
                print(
                    f"| {kind} | {writers} | {mode} | {rate:,.0f} | {p50:.2f} | {p99:.2f} | "
                    f"{per_group} | {rate / off:.2f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
