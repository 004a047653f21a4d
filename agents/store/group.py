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


@dataclass
class _Slot(Generic[T, R]):
    item: T
    done: bool = False
    result: R | None = None
    error: BaseException | None = field(default=None)
    # Held from the start; released once, to wake its writer: its group is committed,
    # or it is to lead the next one. One wake per writer: a shared condition woke every
    # waiting writer at each group's end, and each took the GIL only to wait again
    # (under load most of an agent's futex calls and context switches).
    wake: threading.Lock = field(default_factory=threading.Lock)


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
            lead = not self._leading
            self._leading = True
        while not slot.done:
            if not lead:
                slot.wake.acquire()  # woken once: committed, or to lead the next group
                if slot.done:
                    break
            # No commit in flight and ours not done: lead the next group (ours is in
            # it unless more than max_group were queued before it; then lead again).
            with self._lock:
                group = self._queue[: self._max]
                del self._queue[: self._max]
                self._groups += 1
                self._items += len(group)
            try:
                self._run(group)
            except BaseException:
                self._hand_on(group, slot, stepping_down=True)  # interrupted: it raises
                raise
            self._hand_on(group, slot, stepping_down=slot.done)
            lead = True
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _hand_on(
        self, group: list[_Slot[T, R]], leader: _Slot[T, R], *, stepping_down: bool
    ) -> None:
        """After a group: wake its writers; when the leader steps down, wake the first
        queued writer to lead the next group (else the leader leads it itself)."""
        following = None
        with self._lock:
            if stepping_down:
                if self._queue:
                    following = self._queue[0]
                else:
                    self._leading = False
        for s in group:
            if s is not leader:
                s.wake.release()
        if following is not None:
            following.wake.release()

    def _run(self, group: list[_Slot[T, R]]) -> None:
        try:
            outcomes = self._commit([s.item for s in group])
            if len(outcomes) != len(group):
                raise StorageError(
                    f"group commit gave {len(outcomes)} outcomes for {len(group)} writes"
                )
        except Exception as err:  # noqa: BLE001 - each writer of the group gets it
            outcomes = [err] * len(group)
        except BaseException:
            # Interrupted (KeyboardInterrupt, SystemExit) in the leader: it re-raises;
            # the other writers are told their write did not commit.
            for s in group:
                s.done = True
                s.error = InterruptedCommitError(
                    "the group commit of this write was interrupted; it may or may not be stored"
                )
            raise
        for s, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                s.error = outcome
            else:
                s.result = outcome
            s.done = True
