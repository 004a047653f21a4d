"""Critical-class writes through the agents: none acked and lost, one owner per epoch.

* `LOST`: every critical write the owner's agent acknowledged (synchronous
  replication reached its copies) is, after heal and catch-up, in every region
  its placement names, or superseded there by a newer version some write made
  (the lost-writes check over the critical datasets only).
* `ONE_OWNER`: from the agents' accept logs, no epoch of a dataset had writes
  accepted by two regions' agents (two owners in one epoch is a split brain the
  fence must make impossible), and each region's accepted epochs never go down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from chaos.checkers import lost_writes
from chaos.checkers.verdict import Verdict
from chaos.history import Operation
from chaos.records import AcceptRecord, ObjectState

LOST = "no-acked-critical-write-lost"
ONE_OWNER = "one-owner-per-epoch"


def lost(
    operations: Iterable[Operation],
    final: Iterable[ObjectState],
    holders: Mapping[str, Sequence[str]],
) -> Verdict:
    """`holders`: critical dataset -> the regions its placement names (home + replicas)."""
    return lost_writes.check(operations, final, holders, datasets=set(holders), name=LOST)


def one_owner(accepts: Iterable[AcceptRecord], datasets: Iterable[str]) -> Verdict:
    wanted = set(datasets)
    problems: list[str] = []
    by_epoch: dict[tuple[str, int], dict[str, float]] = {}
    newest: dict[tuple[str, str], tuple[int, float]] = {}
    count = 0
    for a in sorted((a for a in accepts if a.accepted and a.dataset in wanted), key=lambda a: a.t):
        count += 1
        by_epoch.setdefault((a.dataset, a.epoch), {}).setdefault(a.region, a.t)
        top = newest.get((a.dataset, a.region))
        if top is not None and a.epoch < top[0]:
            problems.append(
                f"{a.dataset}: {a.region} accepted epoch {a.epoch} at t={a.t:.3f} after "
                f"accepting epoch {top[0]} at t={top[1]:.3f}"
            )
        if top is None or a.epoch > top[0]:
            newest[(a.dataset, a.region)] = (a.epoch, a.t)
    for (ds, epoch), regions in sorted(by_epoch.items()):
        if len(regions) > 1:
            shown = ", ".join(f"{r} from t={t:.3f}" for r, t in sorted(regions.items()))
            problems.append(f"{ds}: epoch {epoch} accepted by {shown}")
    epochs = len(by_epoch)
    return Verdict.of(
        ONE_OWNER, problems, f"{count} accepted critical writes in {epochs} epochs, one owner each"
    )
