"""The one place that builds rows of the failover journal (`JournalEntry`).

A row's id is `journal_id(dataset, epoch[, suffix])`, deterministic, so a row lost
by a crash is rebuilt under the same id and appending twice is a no-op. Three kinds
of row, each built here and nowhere else:

* `moved_entry`: ownership moved (an automatic failover, an operator's failover,
  a switchover or a drain), written by the mover right after its transaction;
* `backfilled_entry`: the same move, rebuilt from the owner record by a
  controller when the mover stopped before writing it;
* `aborted_entry`: a switchover that did not move ownership (timed out,
  interrupted, lost its lease, or ended by an operator with `--abort`). Its id
  carries the handover mark's revision, so the runbook and an operator ending the
  same handover write one row, not two.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.coordination.catalog_glue.sources import JournalEntry, journal_id, unmeasured
from controlplane.coordination.orchestration.decide import Move
from controlplane.coordination.protocols.ownership import Owner
from controlplane.coordination.timeutil import parse_rfc3339, rfc3339, utcnow

ABORTED_PREFIX = "aborted: "
INCOMPLETE_KEPT = 100  # versions named in `details`; the count is in rpo_versions


def moved_entry(
    move: Move,
    epoch: int,
    *,
    kind: str,
    reason: str,
    actor: str,
    started_at: datetime,
    completed_at: datetime,
    detected_at: datetime | None = None,
    incomplete: Sequence[str] | None = None,
    exposure_facts: dict[str, object] | None = None,
) -> JournalEntry:
    """The row of a move that committed at `epoch`; `incomplete` are the versions the
    new owner had not completed (its RPO exposure), None when not measured;
    `exposure_facts` say how it was measured when the agents told it."""
    details: dict[str, object] = {"epoch_before": move.epoch_before, **(exposure_facts or {})}
    versions = [v for v in incomplete or () if not unmeasured(v)]
    if incomplete is not None:
        details["incomplete_versions"] = versions[:INCOMPLETE_KEPT]
    why = next((v for v in incomplete or () if unmeasured(v)), None)
    if why is not None:  # the probe could not compare: say so, not "one version missing"
        details["rpo_versions_unknown"] = True
        details["rpo_error"] = why[1:-1]
    return JournalEntry(
        id=journal_id(move.dataset, epoch),
        dataset=move.dataset,
        from_region=move.from_region,
        to_region=move.to_region,
        epoch=epoch,
        kind=kind,
        reason=reason,
        actor=actor,
        detected_at=detected_at,
        started_at=started_at,
        completed_at=completed_at,
        rpo_versions=len(versions),
        details=details,
    )


def backfilled_entry(owner: Owner, actor: str) -> JournalEntry:
    """The row of a move, rebuilt from its owner record by `actor` (a controller)."""
    try:
        at = parse_rfc3339(owner.at)
    except ValueError:
        at = utcnow()  # an unreadable time: when it was noticed is the best we know
    return JournalEntry(
        id=journal_id(owner.dataset, owner.epoch),
        dataset=owner.dataset,
        from_region=owner.from_region,
        to_region=owner.region,
        epoch=owner.epoch,
        kind=owner.kind or "automatic",
        reason=(
            f"{owner.reason} (journaled late by {actor}: the mover stopped before writing "
            "this row; RPO exposure not measured)"
        ),
        actor=owner.actor,
        detected_at=None,
        started_at=at,
        completed_at=at,
        rpo_versions=0,
        details={
            "backfilled": True,
            "backfilled_by": actor,
            "epoch_before": owner.epoch_before,
            "rpo_versions_unknown": True,
        },
    )


def aborted_entry(
    move: Move,
    handover_revision: int,
    *,
    kind: str,
    reason: str,
    actor: str,
    started: datetime,
    missing: Sequence[str],
    why: str,
    restored: bool,
) -> JournalEntry:
    """The row of a switchover that did not move ownership.

    Its `outcome` is "aborted"; `to` is the region that kept ownership (no move
    happened), `completed_at` is empty (the move never completed), and `reason`
    starts with "aborted: " and names the intended target and why. `details` keeps
    the structured facts (intended_to, ended_at, restored, ...).
    """
    kept = (
        f"{move.from_region} kept ownership at epoch {move.epoch_before}"
        if restored
        else "its handover mark was already gone"
    )
    return JournalEntry(
        id=journal_id(move.dataset, move.epoch_before, f"-abort-{handover_revision}"),
        dataset=move.dataset,
        from_region=move.from_region,
        to_region=move.from_region,
        epoch=move.epoch_before,
        kind=kind,
        reason=(
            f"{ABORTED_PREFIX}{kind} to {move.to_region} not done, {why}; {kept} "
            f"(reason given: {reason})"
        ),
        actor=actor,
        detected_at=None,
        started_at=started,
        completed_at=None,
        rpo_versions=len(missing),
        details={
            "intended_to": move.to_region,
            "reason_given": reason,
            "ended_at": rfc3339(utcnow()),
            "restored": restored,
            "incomplete_versions": list(missing[:INCOMPLETE_KEPT]),
        },
        outcome="aborted",
    )


def outcome_of(entry: JournalEntry) -> str:
    """ "aborted" for a switchover that did not move ownership, else "moved"."""
    return "aborted" if entry.outcome == "aborted" else "moved"
