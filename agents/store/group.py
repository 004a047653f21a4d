"""Group commit: the single writes of many threads made durable together.

A writer hands its item to `GroupCommitter.submit` and blocks until the item is
committed. The first writer to find no commit in flight becomes the leader: it takes
every item queued so far (its own included) and commits them as one group, while
writers that arrive meanwhile queue up; when the leader is done, one of them leads
the next group with all of those. A lone writer therefore commits at once (there is
no waiting window), and under load each group holds whatever arrived during the
previous commit: the classic leader/follower group commit of databases' logs.

The commit function returns one outcome per item (its result, or the exception that
item alone raises), so one bad item fails only its own writer. A writer may hand
several items at once (`submit_many`: the small Puts an agent's committer thread
took from its queue): they go in one group, and it gets each item's outcome.
"""

from __future__ import annotations

import copy
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
    items: Sequence[T]
    done: bool = False
    outcomes: Sequence[R | BaseException] = ()
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
        """Items waiting for the next group (not counting those being committed)."""
        with self._lock:
            return sum(len(s.items) for s in self._queue)

    def submit(self, item: T) -> R:
        """Commit `item` with whatever else is queued; returns its result or raises its
        error once its group is committed."""
        slot: _Slot[T, R] = _Slot((item,))
        self._wait(slot)
        outcome, slot.outcomes = slot.outcomes[0], ()
        if isinstance(outcome, BaseException):
            # Raised from a frame that keeps no reference to it: its traceback holds
            # this frame (see `_run`).
            try:
                raise outcome
            finally:
                del outcome
        return outcome

    def submit_many(self, items: Sequence[T]) -> list[R | BaseException]:
        """Commit `items` in one group, with whatever else is queued; returns each
        item's outcome (its result, or its error) once the group is committed. More
        than `max_group` items, or none, is a ValueError: a caller's batch is bounded."""
        if not 0 < len(items) <= self._max:
            raise ValueError(f"submit_many takes 1 to {self._max} items, got {len(items)}")
        slot: _Slot[T, R] = _Slot(items)
        self._wait(slot)
        outcomes, slot.outcomes = list(slot.outcomes), ()
        return outcomes

    def _wait(self, slot: _Slot[T, R]) -> None:
        """Queue `slot` and return once its items are committed (leading a group when
        it is its turn)."""
        slot.wake.acquire()
        with self._lock:
            self._queue.append(slot)
            slot.leads = not self._leading
            self._leading = True
        try:
            if not slot.leads:
                slot.wake.acquire()  # woken once: committed, or to lead the next group
            if not slot.done:
                self._lead(slot)
        except BaseException:
            # A signal in the main thread (Ctrl-C) while it waited or was about to
            # lead: its item leaves the queue, and a lead it holds passes on. (Only a
            # thread's own code can be interrupted so; the agent's writers are
            # executor threads. A signal inside the hand-over's wakes is not covered.)
            if not slot.done:
                self._abandon(slot)
            raise

    def _lead(self, leader: _Slot[T, R]) -> None:
        """Commit the next group, then hand on. A leader is the queue's head (it found
        none queued, or was handed the lead as the head), so its own item is in the
        group, and done after it however the group ended."""
        group: list[_Slot[T, R]] = []
        ended = False
        try:
            with self._lock:
                taken = items = 0
                for s in self._queue:  # whole slots, at least one, up to max_group items
                    if taken and items + len(s.items) > self._max:
                        break
                    taken, items = taken + 1, items + len(s.items)
                group = self._queue[:taken]
                del self._queue[:taken]
                self._groups += 1
                self._items += items
            self._run(group)
            ended = True
        finally:
            if not ended:
                self._interrupted(group)
            self._hand_on(group, leader)

    def _interrupted(self, group: list[_Slot[T, R]]) -> None:
        """A group whose leader was interrupted (a signal, anywhere in `_lead`): its
        writers are told their write may or may not be stored, and none of it is left
        queued, for another leader to hand the lead to a writer that has left."""
        with self._lock:
            self._queue = [q for q in self._queue if all(q is not s for s in group)]
        for s in group:
            if not s.done:
                s.outcomes = [
                    InterruptedCommitError(
                        "the group commit of this write was interrupted; it may or may not "
                        "be stored"
                    )
                    for _ in s.items
                ]
                s.done = True

    def _hand_on(self, group: list[_Slot[T, R]], leader: _Slot[T, R]) -> None:
        """After a group: wake its writers, and the first queued writer to lead the
        next group."""
        with self._lock:
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
        # No local names the outcomes: a commit error's traceback holds this frame
        # (through `_outcomes`'s), and a frame holding it back makes a cycle that keeps
        # the group's items (inline bytes) until the collector runs. Interrupted
        # (KeyboardInterrupt, SystemExit), it raises and `_lead` tells the group.
        self._settle(group, self._outcomes([item for s in group for item in s.items]))

    @staticmethod
    def _settle(group: list[_Slot[T, R]], outcomes: Sequence[R | BaseException]) -> None:
        at = 0
        for s in group:
            s.outcomes = outcomes[at : at + len(s.items)]
            at += len(s.items)
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
            return [err] + [own_copy(err) for _ in items[1:]]
        return outcomes


def own_copy(err: Exception) -> Exception:
    """`err` again for another writer of its group, as its own object: each writer
    raising the one object would add its frames to one traceback, and every writer's
    frames (its item) would live as long as any writer kept the error. The copy has
    the same type, message, cause and traceback; an error that cannot be copied is
    shared, as before."""
    try:
        mine = copy.copy(err)
    except Exception:  # noqa: BLE001 - an exception type whose arguments do not rebuild it
        return err
    mine.__traceback__ = err.__traceback__
    mine.__cause__, mine.__context__ = err.__cause__, err.__context__
    mine.__suppress_context__ = err.__suppress_context__
    return mine
