"""Store benchmark: write throughput of the agent's store beside plain tools, one run.

    python benchmarks/store_bench.py                  # 256 x 1 MiB and 1024 x 64 KiB
    python benchmarks/store_bench.py --scale 0.25 --repeat 1

For each workload the same source files (random bytes, written first and left in
the page cache) are written durably three ways, in the same run, on the same
file system:

- `store`: `ObjectStore.put` of each file (temp file hashed in one pass, fsync,
  rename, folder fsync, SQLite WAL commit with synchronous=FULL), one at a time;
- `store put_many(64)`: the same, 64 objects per call (a bundle: their fsyncs run
  in parallel and their rows share one transaction); each call is durable when it
  returns, as each `put` is;
- `cp+sync`: one `cp` of every file, then one `sync FILE...` (fsync of each);
- `dd`: one `dd bs=1M conv=fsync` process per file.

Each method runs `--repeat` times (rounds interleaved) into a fresh folder; the
best time counts. The
ratio is the store's throughput over the method's (above 1: the store is faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock

KiB = 1024
MiB = 1024 * KiB
BUNDLE = 64  # objects per put_many call (a bundle of small objects, spec/dataplane.md)


@dataclass(frozen=True)
class Workload:
    name: str
    size: int
    count: int


def make_sources(folder: Path, workload: Workload) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for i in range(workload.count):
        path = folder / f"obj-{i:05d}.bin"
        path.write_bytes(os.urandom(workload.size))
        paths.append(path)
    subprocess.run(["sync", "-f", str(folder)], check=True)
    return paths


def run_store(sources: list[Path], target: Path) -> None:
    with ObjectStore(target, clock=HybridClock("bench")) as store:
        for path in sources:
            with path.open("rb") as handle:
                store.put("bench", path.name, handle, expected_size=path.stat().st_size)


def run_store_bundles(sources: list[Path], target: Path) -> None:
    with ObjectStore(target, clock=HybridClock("bench")) as store:
        for start in range(0, len(sources), BUNDLE):
            batch = sources[start : start + BUNDLE]
            store.put_many([("bench", p.name, [p.read_bytes()]) for p in batch])


def run_cp_sync(sources: list[Path], target: Path) -> None:
    target.mkdir()
    subprocess.run(["cp", *map(str, sources), str(target)], check=True)
    copies = [str(target / p.name) for p in sources]
    subprocess.run(["sync", *copies], check=True)


def run_dd(sources: list[Path], target: Path) -> None:
    target.mkdir()
    for path in sources:
        subprocess.run(
            ["dd", f"if={path}", f"of={target / path.name}", "bs=1M", "conv=fsync", "status=none"],
            check=True,
        )


METHODS: dict[str, Callable[[list[Path], Path], None]] = {
    "store": run_store,
    f"store put_many({BUNDLE})": run_store_bundles,
    "cp+sync": run_cp_sync,
    "dd conv=fsync": run_dd,
}


def best_times(sources: list[Path], work: Path, repeat: int) -> dict[str, float]:
    """Each method once per round, rounds interleaved (the disk is shared, so its load
    drifts); the best round of each counts."""
    best = dict.fromkeys(METHODS, float("inf"))
    for attempt in range(repeat):
        for name, method in METHODS.items():
            target = work / f"out-{attempt}"
            start = time.perf_counter()
            method(sources, target)
            best[name] = min(best[name], time.perf_counter() - start)
            shutil.rmtree(target)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply object counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; best counts")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp)")
    args = parser.parse_args(argv)
    workloads = [
        Workload("1 MiB objects", MiB, max(1, round(256 * args.scale))),
        Workload("64 KiB objects", 64 * KiB, max(1, round(1024 * args.scale))),
    ]
    work = Path(tempfile.mkdtemp(prefix="store-bench-", dir=args.dir))
    try:
        rows = []
        for workload in workloads:
            sources = make_sources(work / f"src-{workload.size}", workload)
            times = best_times(sources, work, args.repeat)
            total = workload.size * workload.count
            for name, seconds in times.items():
                ratio = seconds / times["store"]
                rows.append((
                    f"{workload.count} x {workload.name}", name, seconds,
                    total / seconds / 1e6, workload.count / seconds, ratio,
                ))  # fmt: skip
            shutil.rmtree(sources[0].parent)
        print(f"store write throughput, fsync on, best of {args.repeat}, work folder {work}")
        header = ("workload", "method", "seconds", "MB/s", "objects/s", "store ÷ method")
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(" --- " for _ in header) + "|")
        for workload_name, name, seconds, mbps, ops, ratio in rows:
            shown = "1.00 (itself)" if name == "store" else f"{ratio:.2f}"
            if name.startswith("store put_many"):
                shown = f"{1 / ratio:.2f} (bundle ÷ store)"
            print(
                f"| {workload_name} | {name} | {seconds:.2f} | {mbps:.1f} | {ops:.0f} | {shown} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
