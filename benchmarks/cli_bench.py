"""How fast the `meridian` command starts: the targets of issue 9, section 4.

    nice -n 10 python benchmarks/cli_bench.py [--runs 10] [--meridian PATH] [--json]

Runs each case `--runs` times, round-robin (so that a burst of load from other work
on the machine hits every case alike), after one untimed warm-up run each (which
also writes the bytecode caches). Each run is one child process started with
posix_spawn and reaped with wait4, so its peak RSS is the child's own
(`ru_maxrss`), not the largest of all children so far. Prints the median wall time
and median peak RSS of each case beside `python -c pass` (the interpreter's own
start), the target, and whether it is met. Exits 1 if a command fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "policy" / "data" / "example.yaml"


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    max_s: float | None = None
    max_mb: float | None = None


@dataclass
class Result:
    case: Case
    seconds: list[float]
    rss_mb: list[float]
    cpu_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_s)

    @property
    def median_mb(self) -> float:
        return statistics.median(self.rss_mb)

    @property
    def met(self) -> bool | None:
        if self.case.max_s is None and self.case.max_mb is None:
            return None
        return (self.case.max_s is None or self.median_s <= self.case.max_s) and (
            self.case.max_mb is None or self.median_mb <= self.case.max_mb
        )

    def target(self) -> str:
        parts = []
        if self.case.max_s is not None:
            parts.append(f"<= {self.case.max_s:.2f} s")
        if self.case.max_mb is not None:
            parts.append(f"<= {self.case.max_mb:.0f} MB")
        return ", ".join(parts) or "(reference)"


def run_once(argv: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MB) and CPU seconds of one run of argv, output discarded."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        start = time.perf_counter()
        pid = os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, devnull, 2),
            ],
        )
        _, status, usage = os.wait4(pid, 0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(devnull)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with status {code}")
    # ru_maxrss is in KiB on Linux. CPU time (user + system) is what the run would take
    # on an idle machine, near enough; wall time is what the targets are about.
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def cases(meridian: str, scratch: Path) -> list[Case]:
    empty = scratch / "empty.bin"
    empty.write_bytes(b"")
    return [
        Case("python -c pass", [sys.executable, "-c", "pass"]),
        Case("meridian --version", [meridian, "--version"], max_s=0.15, max_mb=40),
        Case(
            "meridian policy validate example.yaml",
            [meridian, "policy", "validate", str(EXAMPLE)],
            max_s=0.5,
        ),
        Case(
            "meridian delta signature (empty file)",
            [meridian, "delta", "signature", str(empty), str(scratch / "empty.sig")],
            max_s=0.2,
        ),
    ]


def measure(todo: list[Case], runs: int) -> list[Result]:
    results = [Result(c, [], [], []) for c in todo]
    for r in results:
        run_once(r.case.argv)  # warm-up: bytecode caches, page cache
    for _ in range(runs):
        for r in results:
            seconds, mb, cpu = run_once(r.case.argv)
            r.seconds.append(seconds)
            r.rss_mb.append(mb)
            r.cpu_s.append(cpu)
    return results


def table(results: list[Result], runs: int) -> str:
    head = (
        f"{'case':40} {'median s':>9} {'min s':>6} {'CPU s':>6} {'peak RSS MB':>12}  "
        f"{'target':21} verdict"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        verdict = {None: "", True: "met", False: "NOT MET"}[r.met]
        lines.append(
            f"{r.case.name:40} {r.median_s:9.3f} {r.min_s:6.3f} {r.median_cpu_s:6.3f} "
            f"{r.median_mb:12.1f}  {r.target():21} {verdict}"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines.append(
        f"median of {runs} runs each, round-robin; the verdict is on the median wall time "
        f"(and RSS); CPU s (user + system) and peak RSS are medians of each run's own, and "
        f"CPU s is near what an idle machine would take; load average {load} on "
        f"{os.cpu_count()} CPUs; nice {os.nice(0)}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--meridian",
        default=str(Path(sys.executable).with_name("meridian")),
        help="the meridian executable (default: beside this Python)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not os.access(args.meridian, os.X_OK):
        parser.error(f"{args.meridian} is not an executable; pass --meridian PATH")
    with tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp:
        try:
            results = measure(cases(args.meridian, Path(tmp)), args.runs)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        doc = [
            {
                "case": r.case.name,
                "median_s": round(r.median_s, 4),
                "min_s": round(r.min_s, 4),
                "median_cpu_s": round(r.median_cpu_s, 4),
                "median_peak_rss_mb": round(r.median_mb, 1),
                "target": r.target(),
                "met": r.met,
                "seconds": [round(s, 4) for s in r.seconds],
            }
            for r in results
        ]
        print(json.dumps({"runs": args.runs, "load": os.getloadavg(), "results": doc}, indent=2))
    else:
        print(table(results, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
