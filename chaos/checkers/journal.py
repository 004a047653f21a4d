"""The controllers' records agree with etcd after the heal.

* `journaled`: every ownership move seen in etcd during the run (a dataset's
  owner record changing to a new region and epoch) has a failover-journal row in
  the catalog with that epoch and destination (issue 14: a committed move whose
  transaction reply was lost must still be journaled).
* `views_agree`: each controller's count of owned datasets (its
  `meridian_controller_datasets_owned` gauge, fed by a watch of the owners)
  equals what etcd says it owns: a watch that resumed after a reconnect and
  skipped an event leaves a controller believing it owns what it lost, or not
  owning what it won.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from chaos.checkers.verdict import Verdict
from chaos.records import OwnerSample

JOURNALED = "moves-journaled"
VIEWS = "controllers-agree-with-etcd"


def journaled(owners: Iterable[OwnerSample], journal: Iterable[Mapping[str, object]]) -> Verdict:
    rows = {(str(r.get("dataset")), r.get("epoch"), str(r.get("to"))) for r in journal}
    seen: dict[str, tuple[str, int]] = {}
    problems: list[str] = []
    moves = 0
    for s in sorted(owners, key=lambda s: s.t):
        prev = seen.get(s.dataset)
        now = (s.region, s.epoch)
        seen[s.dataset] = now
        if prev is None or prev == now:
            continue
        moves += 1
        if (s.dataset, s.epoch, s.region) not in rows:
            problems.append(
                f"{s.dataset} moved {prev[0]}@{prev[1]} -> {s.region}@{s.epoch} (seen at "
                f"t={s.t:.3f}) with no failover journal row"
            )
    return Verdict.of(JOURNALED, problems, f"{moves} moves, each journaled")


def views_agree(owned_gauge: Mapping[str, float | None], owners: Mapping[str, str]) -> Verdict:
    """`owned_gauge`: region -> its controller's gauge (None: no answer);
    `owners`: dataset -> owner region per etcd, read after the heal."""
    truth = Counter(owners.values())
    problems = []
    for region, got in sorted(owned_gauge.items()):
        if got is None:
            problems.append(f"{region}'s controller did not report its owned datasets")
        elif int(got) != truth.get(region, 0):
            problems.append(
                f"{region}'s controller believes it owns {int(got)} datasets; etcd says "
                f"{truth.get(region, 0)}"
            )
    return Verdict.of(VIEWS, problems, "every controller's view matches etcd")
