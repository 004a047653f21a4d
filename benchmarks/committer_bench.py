"""The group committer alone (agents/store/group.py): its own CPU per write, this tree's
beside another revision's, in one run.

    python benchmarks/committer_bench.py              # against 24571e3 (shared wakeups)
    python benchmarks/committer_bench.py REV --writers 64 --writes 200 --rounds 5

32 threads (`--writers`) submit `--writes` items each; the commit function sleeps
1.5 ms with the GIL released, as a group's fsyncs do, so what the process's CPU time
counts is the committer's queueing, waking and hand-over, not the commit. The two
versions alternate round by round; the table gives each one's median.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FSYNC_S = 0.0015


def load(name: str, source: str, folder: Path) -> ModuleType:
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def commit(items: Sequence[int]) -> list[int]:
    time.sleep(FSYNC_S)
    return list(items)


def one_round(module: ModuleType, writers: int, writes: int) -> tuple[float, float, float]:
    """(writes/s, CPU us per write, writes per group) of one round."""
    committer = module.GroupCommitter(commit)

    def writer(_: int) -> None:
        for i in range(writes):
            committer.submit(i)

    cpu, wall = time.process_time(), time.monotonic()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    total = writers * writes
    stats = committer.stats()
    return total / wall, 1e6 * cpu / total, stats.items / stats.groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", default="24571e3", help="the revision to compare")
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--writes", type=int, default=300, help="per writer and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.rev}:agents/store/group.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="committer-bench-") as tmp:
        sides = {
            args.rev: load("committer_old", old, Path(tmp)),
            "this tree": load(
                "committer_new", (ROOT / "agents/store/group.py").read_text(), Path(tmp)
            ),
        }
        runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, module in sides.items():
                runs[side].append(one_round(module, args.writers, args.writes))
    print(
        f"group committer, {args.writers} writers x {args.writes} writes, a {FSYNC_S * 1e3} ms "
        f"commit; medians of {args.rounds} alternated rounds"
    )
    print(f"{'version':<12} {'writes/s':>9} {'CPU us/write':>13} {'writes/group':>13}")
    for side, rows in runs.items():
        rate, cpu, group = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"{side:<12} {rate:>9.0f} {cpu:>13.1f} {group:>13.1f}")
    old_cpu = statistics.median(r[1] for r in runs[args.rev])
    new_cpu = statistics.median(r[1] for r in runs["this tree"])
    print(f"CPU per write, this tree / {args.rev}: {new_cpu / old_cpu:.2f}")


if __name__ == "__main__":
    main()
