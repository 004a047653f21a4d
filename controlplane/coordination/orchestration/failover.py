"""Carry out ownership moves: one guarded transaction per dataset, then a journal row.

Several live controllers may run `apply_move` for the same dataset at once; the
transaction compares the owner's epoch, so exactly one wins and the others get
`ConflictError` (which they treat as "someone else did it"). Automatic moves also
guard, in the same transaction, that the source region is still dead, that
maintenance mode is still off, that the target is still alive and its state has
not changed: a decision taken on a stale view fails instead of moving anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from controlplane.coordination.catalog_glue.sources import (
    CatchUpProbe,
    FailoverJournal,
    JournalEntry,
)
from controlplane.coordination.orchestration.decide import Move
from controlplane.coordination.orchestration.journal import moved_entry
from controlplane.coordination.orchestration.prefer import Exposure
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import MoveFacts, Ownership
from controlplane.coordination.protocols.view import ClusterView
from controlplane.coordination.timeutil import utcnow
from controlplane.errors import ConflictError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Cmp, Compare, Target

log = get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MoveResult:
    move: Move
    epoch: int
    entry: JournalEntry


def source_dead_guard(move: Move) -> Compare:
    return Compare(keys.alive(move.from_region), Target.CREATE, Cmp.EQUAL, 0)


def automatic_guards(move: Move, view: ClusterView, policy_key_revision: int) -> list[Compare]:
    """The facts an automatic failover relied on, as transaction compares.

    They include the policy it was decided under (`PolicyView.decided`: the mod revision
    of the policy key the view last read; 0: none): a controller whose view lags an
    apply that dropped the target from the dataset's regions, or narrowed its
    residency, would otherwise move ownership where the new policy forbids it. The
    sweep decides again on the new policy within a reconcile interval.
    """
    guards = [
        Compare(keys.alive(move.from_region), Target.CREATE, Cmp.EQUAL, 0),
        Compare(keys.MAINTENANCE, Target.CREATE, Cmp.EQUAL, 0),
        Compare(keys.alive(move.to_region), Target.VERSION, Cmp.GREATER, 0),
        Compare(
            keys.state(move.to_region),
            Target.MOD,
            Cmp.EQUAL,
            view.state_revisions.get(move.to_region, 0),
        ),
    ]
    if policy_key_revision > 0:
        guards.append(Compare(keys.POLICY_CURRENT, Target.MOD, Cmp.EQUAL, policy_key_revision))
    return guards


def target_guards(move: Move, view: ClusterView) -> list[Compare]:
    """Guards of an operator's move: the target is still alive and in the same state."""
    return [
        Compare(keys.alive(move.to_region), Target.VERSION, Cmp.GREATER, 0),
        Compare(
            keys.state(move.to_region),
            Target.MOD,
            Cmp.EQUAL,
            view.state_revisions.get(move.to_region, 0),
        ),
    ]


class MoveTracker:
    """The moves one actor (a controller, a runbook session) has started.

    `run` runs a move in a task of its own that cancelling the caller does not
    reach (the caller still sees CancelledError): a controller stopping on SIGTERM
    must not leave a committed move without its journal row. `finish` waits for
    what is still running; a move that fails after its caller left is logged.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self, move: Coroutine[Any, Any, T]) -> T:
        task = asyncio.create_task(move)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_log_orphan_failure)
            raise

    async def finish(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for the moves still running; how many are left after
        that (their journal rows are then left to the controllers' backfill)."""
        if not self._tasks:
            return 0
        _, still = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return len(still)


def _log_orphan_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("move_failed_after_caller_left", task=task.get_name(), error=str(exc))


async def apply_move(
    ownership: Ownership,
    move: Move,
    *,
    guards: list[Compare],
    kind: str,
    reason: str,
    actor: str,
    journal: FailoverJournal,
    probe: CatchUpProbe | None,
    detected_at: datetime | None,
    started_at: datetime | None = None,
    exposure: Exposure | None = None,
) -> MoveResult | None:
    """Race the move's transaction; on a win, journal it and return the result.

    Returns None when another actor moved the dataset first or a guard failed.

    `exposure`, when given, is the RPO exposure measured from the agents before the
    move (the versions the target lacks of what the live holders hold): it is
    journaled instead of asking `probe` (the catalog), which learns of copies later.

    Callers run it through a `MoveTracker`, so that once started it runs to its
    end (transaction, then journal row) even if they are cancelled.
    """
    started = started_at or utcnow()
    try:
        epoch = await ownership.claim(
            move.dataset,
            move.to_region,
            expect_epoch=move.epoch_before,
            reason=reason,
            actor=actor,
            guards=guards,
            move=MoveFacts(kind, move.from_region),
        )
    except ConflictError:
        log.info("move_lost_race", dataset=move.dataset, to=move.to_region, kind=kind)
        return None
    completed = utcnow()
    missing: list[str] = []
    if exposure is not None:
        missing = list(exposure.missing)
    elif probe is not None:
        missing = await asyncio.to_thread(probe.incomplete_versions, move.dataset, move.to_region)
    entry = moved_entry(
        move,
        epoch,
        kind=kind,
        reason=reason,
        actor=actor,
        detected_at=detected_at,
        started_at=started,
        completed_at=completed,
        incomplete=missing,
        exposure_facts=None if exposure is None else exposure.facts(),
    )
    await asyncio.to_thread(journal.append, entry)
    log.info(
        "ownership_moved",
        dataset=move.dataset,
        from_region=move.from_region,
        to=move.to_region,
        epoch=epoch,
        kind=kind,
        reason=reason,
        rpo_versions=entry.rpo_versions,
    )
    return MoveResult(move, epoch, entry)
