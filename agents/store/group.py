"""Group commit: the single writes of many threads made durable together.

A writer hands its item to `GroupCommitter.submit` and blocks until the item is
committed. The first writer to find no commit in flight becomes the leader: it takes
every item queued so far (its own included) and commits them as one group, while
writers that arrive meanwhile queue up; when the leader is done, one of them leads
the next group with all of those. A lone writer therefore commits at once (there is
no waiting window), and under load each group holds whatever arrived during the
previous commit: the classic leader/follower group commit of databases' logs.

The commit function returns one outcome per item (its result, or the exception that
item alone raises), so one bad item fails only its own writer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from agents.store.errors import StorageError

T = TypeVar("T")
R = TypeVar("R")

# At most this many items per group: a group's rows share one SQLite transaction, and
# a bounded group bounds how long the store's lock is held by one commit.
MAX_GROUP = 512


class InterruptedCommitError(StorageError):
    """The leader of this write's group was interrupted: it may or may not be stored."""


@dataclass(frozen=True)
class GroupStats:
    """How many groups were committed, holding how many items in all."""

    groups: int
    items: int


@dataclass(eq=False)  # slots are told apart by identity: two may hold equal items
class _Slot(Generic[T, R]):
    item: T
    done: bool = False
    result: R | None = None
    error: BaseException | None = field(default=None)
    # Held from the start; released once, to wake its writer: its group is committed,
    # or it is to lead the next one (`leads`, set under the committer's lock). One wake
    # per writer: a shared condition woke every waiting writer at each group's end, and
    # each took the GIL only to wait again (most of an agent's futex calls under load).
    wake: threading.Lock = field(default_factory=threading.Lock)
    leads: bool = False


class GroupCommitter(Generic[T, R]):
    """Commits the items of concurrent `submit` calls in groups (see the module)."""

    def __init__(
        self,
        commit: Callable[[Sequence[T]], Sequence[R | BaseException]],
        *,
        max_group: int = MAX_GROUP,
    ) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be at least 1, got {max_group}")
        self._commit = commit
        self._max = max_group
        self._lock = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._leading = False
        self._groups = 0
        self._items = 0

    def stats(self) -> GroupStats:
        with self._lock:
            return GroupStats(self._groups, self._items)

    def queued(self) -> int:
        """Writes waiting for the next group (not counting those being committed)."""
        with self._lock:
            return len(self._queue)

    def submit(self, item: T) -> R:
        """Commit `item` with whatever else is queued; returns its result or raises its
        error once its group is committed."""
        slot: _Slot[T, R] = _Slot(item)
        slot.wake.acquire()
        with self._lock:
            self._queue.append(slot)
            slot.leads = not self._leading
            self._leading = True
        if not slot.leads:
            try:
                slot.wake.acquire()  # woken once: committed, or to lead the next group
            except BaseException:
                self._abandon(slot)  # a signal in the main thread, while it waited
                raise
        while not slot.done:
            self._lead(slot)
        error, slot.error = slot.error, None
        if error is not None:
            # Raised from a frame that keeps no reference to it: its traceback holds
            # this frame (see `_run`).
            try:
                raise error
            finally:
                del error
        return slot.result  # type: ignore[return-value]

    def _lead(self, leader: _Slot[T, R]) -> None:
        """Commit the next group, then hand on. A leader is first in the queue (it found
        none, or was handed the lead as its head), so its own item is in the group."""
        with self._lock:
            group = self._queue[: self._max]
            del self._queue[: self._max]
            self._groups += 1
            self._items += len(group)
        ended = False
        try:
            self._run(group)
            ended = True
        finally:
            # Interrupted, it steps down too: the lead must not leave with it.
            self._hand_on(group, leader, stepping_down=leader.done or not ended)

    def _hand_on(
        self, group: list[_Slot[T, R]], leader: _Slot[T, R], *, stepping_down: bool
    ) -> None:
        """After a group: wake its writers; when the leader steps down, wake the first
        queued writer to lead the next group (else the leader leads it itself)."""
        following = None
        with self._lock:
            if stepping_down:
                following = self._pass_lead()
        for s in group:
            if s is not leader:
                s.wake.release()
        if following is not None:
            following.wake.release()

    def _pass_lead(self) -> _Slot[T, R] | None:
        """The queue's head, marked to lead (its writer to be woken), or None and no
        leader while nothing is queued. Called under the lock."""
        if not self._queue:
            self._leading = False
            return None
        following = self._queue[0]
        following.leads = True
        return following

    def _abandon(self, slot: _Slot[T, R]) -> None:
        """A writer that stopped waiting: its item leaves the queue if still there (not
        committed), and a lead handed to it passes on to the next queued writer."""
        with self._lock:
            self._queue = [s for s in self._queue if s is not slot]
            following = self._pass_lead() if slot.leads else None
        if following is not None:
            following.wake.release()

    def _run(self, group: list[_Slot[T, R]]) -> None:
        try:
            # No local names the outcomes: a commit error's traceback holds this frame
            # (through `_outcomes`'s), and a frame holding it back makes a cycle that
            # keeps the group's items (inline bytes) until the collector runs.
            self._settle(group, self._outcomes([s.item for s in group]))
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit) in the leader: it re-raises;
            # the other writers are told their write did not commit.
            for s in group:
                s.done = True
                s.error = InterruptedCommitError(
                    "the group commit of this write was interrupted; it may or may not be stored"
                )
            raise

    @staticmethod
    def _settle(group: list[_Slot[T, R]], outcomes: Sequence[R | BaseException]) -> None:
        for s, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                s.error = outcome
            else:
                s.result = outcome
            s.done = True

    def _outcomes(self, items: list[T]) -> Sequence[R | BaseException]:
        """The commit's outcome per item, or its error for each (`_run`: no frame on
        the error's traceback keeps it)."""
        try:
            outcomes = self._commit(items)
            if len(outcomes) != len(items):
                raise StorageError(
                    f"group commit gave {len(outcomes)} outcomes for {len(items)} writes"
                )
        except Exception as err:  # noqa: BLE001 - each writer of the group gets it
            return [err] * len(items)
        return outcomes
