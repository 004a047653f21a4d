"""Split brain, from the accept logs of critical writes and the owner records seen.

Violations:
* a write accepted at an epoch older than one already accepted for its dataset
  (in time order): a stale-epoch accept;
* two regions accepting writes for one dataset at overlapping times (each
  region's accepts at one epoch span an interval; intervals of different
  regions must not overlap);
* one epoch accepted from two regions;
* the owner records seen in etcd: an epoch going down, or one epoch with two
  owners; and an accept by a region at an epoch etcd never gave that region
  (checked only when samples cover the dataset).
"""

from __future__ import annotations

from collections.abc import Iterable

from chaos.checkers.verdict import Verdict
from chaos.records import AcceptRecord, OwnerSample

NAME = "no-split-brain"


def check(accepts: Iterable[AcceptRecord], owners: Iterable[OwnerSample] = ()) -> Verdict:
    problems: list[str] = []
    granted: dict[tuple[str, int], str] = {}
    last_epoch: dict[str, int] = {}
    for s in sorted(owners, key=lambda s: s.t):
        if s.epoch < last_epoch.get(s.dataset, 0):
            problems.append(
                f"{s.dataset}: owner epoch went down from {last_epoch[s.dataset]} to {s.epoch}"
            )
        last_epoch[s.dataset] = max(last_epoch.get(s.dataset, 0), s.epoch)
        first = granted.setdefault((s.dataset, s.epoch), s.region)
        if first != s.region:
            problems.append(f"{s.dataset}: epoch {s.epoch} owned by {first} and by {s.region}")
    sampled = {ds for ds, _ in granted}

    ok = sorted((a for a in accepts if a.accepted), key=lambda a: a.t)
    highest: dict[str, tuple[int, float]] = {}
    spans: dict[tuple[str, str, int], list[float]] = {}
    region_of_epoch: dict[tuple[str, int], str] = {}
    for a in ok:
        top = highest.get(a.dataset)
        if top is not None and a.epoch < top[0]:
            problems.append(
                f"{a.dataset}: {a.region} ({a.writer}) accepted stale epoch {a.epoch} at "
                f"t={a.t:.3f}, after epoch {top[0]} was accepted at t={top[1]:.3f}"
            )
        if top is None or a.epoch > top[0]:
            highest[a.dataset] = (a.epoch, a.t)
        first = region_of_epoch.setdefault((a.dataset, a.epoch), a.region)
        if first != a.region:
            problems.append(f"{a.dataset}: epoch {a.epoch} accepted from {first} and {a.region}")
        if a.dataset in sampled and granted.get((a.dataset, a.epoch)) not in (None, a.region):
            problems.append(
                f"{a.dataset}: {a.region} accepted epoch {a.epoch}, which etcd gave to "
                f"{granted[(a.dataset, a.epoch)]}"
            )
        span = spans.setdefault((a.dataset, a.region, a.epoch), [a.t, a.t])
        span[1] = a.t
    by_dataset: dict[str, list[tuple[float, float, str, int]]] = {}
    for (ds, region, epoch), (lo, hi) in spans.items():
        by_dataset.setdefault(ds, []).append((lo, hi, region, epoch))
    for ds, items in by_dataset.items():
        items.sort()
        for i, (lo, hi, region, epoch) in enumerate(items):
            for lo2, hi2, region2, epoch2 in items[i + 1 :]:
                if lo2 > hi:
                    break
                if region2 != region:
                    problems.append(
                        f"{ds}: {region} (epoch {epoch}, t={lo:.3f}..{hi:.3f}) and {region2} "
                        f"(epoch {epoch2}, t={lo2:.3f}..{hi2:.3f}) accepted writes at "
                        "overlapping times"
                    )
    return Verdict.of(NAME, problems, f"{len(ok)} accepted critical writes, one owner at a time")
