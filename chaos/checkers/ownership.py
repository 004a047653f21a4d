"""Ownership stability and progress around a fault window.

* `stable`: no dataset changed owner (region or epoch) while the fault was on
  (plus a grace after it, for a move decided during the fault but seen late):
  a catalog outage or an etcd quorum loss must not fail anything over.
* `resumed`: after the heal, within the recovery bound, every dataset written
  before the fault got at least one write acknowledged again (by whichever
  region owns it by then).
"""

from __future__ import annotations

from collections.abc import Iterable

from chaos.checkers.verdict import Verdict
from chaos.history import Operation
from chaos.records import OwnerSample

STABLE = "no-ownership-change"
RESUMED = "writes-resume"


def stable(owners: Iterable[OwnerSample], start_t: float, end_t: float) -> Verdict:
    before: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    for s in sorted(owners, key=lambda s: s.t):
        if s.t <= start_t:
            before[s.dataset] = (s.region, s.epoch)
            continue
        if s.t > end_t:
            break
        prev = before.get(s.dataset)
        if prev is not None and prev != (s.region, s.epoch):
            problems.append(
                f"{s.dataset} moved from {prev[0]}@{prev[1]} to {s.region}@{s.epoch} at "
                f"t={s.t:.3f}, during the fault ({start_t:.3f}..{end_t:.3f})"
            )
            before[s.dataset] = (s.region, s.epoch)
    return Verdict.of(STABLE, problems, f"{len(before)} datasets kept their owner")


def resumed(operations: Iterable[Operation], fault_start_ns: int, heal_ns: int) -> Verdict:
    wrote_before: set[str] = set()
    wrote_after: set[str] = set()
    for op in operations:
        if op.f != "write" or op.outcome != "ok" or op.complete is None:
            continue
        if op.complete.time_ns < fault_start_ns:
            wrote_before.add(op.invoke.dataset)
        elif op.invoke.time_ns >= heal_ns:
            wrote_after.add(op.invoke.dataset)
    missing = sorted(wrote_before - wrote_after)
    problems = [f"{d} had acked writes before the fault but none after the heal" for d in missing]
    if not wrote_after:
        problems.append("no write was acknowledged after the heal")
    return Verdict.of(RESUMED, problems, f"{len(wrote_after)} datasets written after the heal")


DURING = "writes-during-fault"


def progress(operations: Iterable[Operation], windows: Iterable[tuple[int, int]]) -> Verdict:
    """Every fault window (monotonic ns) saw at least one acknowledged write."""
    acked = [
        op.complete.time_ns
        for op in operations
        if op.f == "write" and op.outcome == "ok" and op.complete is not None
    ]
    problems = [
        f"no write acked during the fault {lo / 1e9:.1f}..{hi / 1e9:.1f} (monotonic s)"
        for lo, hi in windows
        if not any(lo <= t <= hi for t in acked)
    ]
    return Verdict.of(DURING, problems, "writes acked all through the fault")
