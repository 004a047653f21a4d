"""Critical-class writes through the agents: none acked and lost, one owner per epoch.

* `LOST`: every critical write the owner's agent acknowledged (synchronous
  replication reached its copies) is, after heal and catch-up, held (or
  superseded by a newer version some write made) by the dataset's owner at the
  end, whose agent serves its reads, and by at least `quorum` of the regions its
  placement names: an ack promised that many copies, so fewer is a lost write.
  (That every holder ends with it is convergence's business.)
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
    owners: Mapping[str, str] | None = None,
    quorum: int | None = None,
) -> Verdict:
    """`holders`: critical dataset -> the regions its placement names (home + replicas);
    `owners`: dataset -> its owner at the end; `quorum`: copies an ack promises
    (default: every holder)."""
    problems: list[str] = []
    judged = lost_writes.judge(operations, final, holders, datasets=set(holders))
    for op, faults in judged:
        ds = op.invoke.dataset
        regions = holders[ds]
        need = len(regions) if quorum is None else quorum
        owner = (owners or {}).get(ds)
        missing = sorted({r for r, _ in faults})
        if "" in missing:
            problems.append(f"{op.describe()}: acked without a version")
        elif owner is not None and owner in missing:
            why = next(w for r, w in faults if r == owner)
            problems.append(f"{op.describe()}: lost by the owner at the end ({why})")
        elif len(regions) - len(missing) < need:
            problems.append(
                f"{op.describe()}: kept by {len(regions) - len(missing)} of {len(regions)} "
                f"holders, the ack promised {need} ({'; '.join(w for _, w in faults)})"
            )
    acked = len(judged)
    return Verdict.of(LOST, problems, f"{acked} acked critical writes all kept")


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
