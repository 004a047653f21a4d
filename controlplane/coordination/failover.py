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
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from controlplane.coordination import keys
from controlplane.coordination.decide import Move
from controlplane.coordination.ownership import MoveFacts, Ownership
from controlplane.coordination.sources import (
    CatchUpProbe,
    FailoverJournal,
    JournalEntry,
    journal_id,
)
from controlplane.coordination.timeutil import utcnow
from controlplane.coordination.view import ClusterView
from controlplane.errors import ConflictError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Cmp, Compare, Target

log = get_logger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MoveResult:
    move: Move
    epoch: int
    entry: JournalEntry


def source_dead_guard(move: Move) -> Compare:
    return Compare(keys.alive(move.from_region), Target.CREATE, Cmp.EQUAL, 0)


def automatic_guards(move: Move, view: ClusterView) -> list[Compare]:
    """The facts an automatic failover relied on, as transaction compares."""
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


_IN_FLIGHT: set[asyncio.Task[Any]] = set()


def _runs_to_completion(
    fn: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Run each call in a task of its own that cancelling the caller does not reach
    (the caller still sees CancelledError); `finish_moves` waits for those tasks."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        task = asyncio.create_task(fn(*args, **kwargs))
        _IN_FLIGHT.add(task)
        task.add_done_callback(_IN_FLIGHT.discard)
        return await asyncio.shield(task)

    return wrapper


async def finish_moves(timeout_s: float) -> int:
    """Wait up to `timeout_s` for moves already started (their journal rows); how
    many are still running after that (their rows are left to the journal backfill)."""
    pending = {t for t in _IN_FLIGHT if t.get_loop() is asyncio.get_running_loop()}
    if not pending:
        return 0
    _, still = await asyncio.wait(pending, timeout=timeout_s)
    for t in pending - still:
        if not t.cancelled() and t.exception() is not None:
            log.warning("move_failed_while_stopping", task=t.get_name(), error=str(t.exception()))
    return len(still)


@_runs_to_completion
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
) -> MoveResult | None:
    """Race the move's transaction; on a win, journal it and return the result.

    Returns None when another actor moved the dataset first or a guard failed.

    Once started, a move runs to its end (transaction, then journal row) even if
    its caller is cancelled (a controller stopping on SIGTERM, say): a committed
    move must not be left without its row. `finish_moves` waits for them.
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
    if probe is not None:
        missing = await asyncio.to_thread(probe.incomplete_versions, move.dataset, move.to_region)
    entry = JournalEntry(
        id=journal_id(move.dataset, epoch),
        dataset=move.dataset,
        from_region=move.from_region,
        to_region=move.to_region,
        epoch=epoch,
        kind=kind,
        reason=reason,
        actor=actor,
        detected_at=detected_at,
        started_at=started,
        completed_at=completed,
        rpo_versions=len(missing),
        details={"epoch_before": move.epoch_before, "incomplete_versions": missing[:100]},
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
        rpo_versions=len(missing),
    )
    return MoveResult(move, epoch, entry)
