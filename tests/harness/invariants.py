"""Checkers for the safety invariants, used by the tests and the failover benchmark.

* `epoch_violations`: over a series of ownership samples, an epoch went down, or
  one epoch was seen with two different owners.
* `split_brain`: in a fenced write log (in decision order), a write was accepted
  with an epoch older than one already accepted, or two regions had writes
  accepted under the same epoch. Either means two writers acted as owner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def epoch_violations(samples: Iterable[Mapping[str, tuple[str, int]]]) -> list[str]:
    last: dict[str, tuple[str, int]] = {}
    by_epoch: dict[tuple[str, int], str] = {}
    bad: list[str] = []
    for i, sample in enumerate(samples):
        for dataset, (region, epoch) in sample.items():
            prev = last.get(dataset)
            if prev is not None and epoch < prev[1]:
                bad.append(f"sample {i}: {dataset} epoch went from {prev[1]} down to {epoch}")
            seen = by_epoch.setdefault((dataset, epoch), region)
            if seen != region:
                bad.append(f"sample {i}: {dataset} epoch {epoch} owned by {seen} and {region}")
            last[dataset] = (region, epoch)
    return bad


def split_brain(log: Iterable[Mapping[str, object]]) -> list[str]:
    highest: dict[str, int] = {}
    writer_of: dict[tuple[str, int], object] = {}
    bad: list[str] = []
    for i, rec in enumerate(log):
        if not rec.get("accepted"):
            continue
        dataset = str(rec["dataset"])
        epoch = rec["epoch"]
        if not isinstance(epoch, int):
            continue
        if epoch < highest.get(dataset, 0):
            bad.append(f"write {i}: {dataset} accepted epoch {epoch} after {highest[dataset]}")
        highest[dataset] = max(highest.get(dataset, 0), epoch)
        region = rec.get("region")
        first = writer_of.setdefault((dataset, epoch), region)
        if first != region:
            bad.append(f"write {i}: {dataset} epoch {epoch} written by {first} and {region}")
    return bad
