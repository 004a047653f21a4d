"""Small Puts stamped on the event loop and committed by one thread, in groups.

Each small Put (`PutSmall`, or a Put stream that ended within `INLINE_BYTES`) used
to take an executor thread of its own: a hand-off to it, a wake-up of the loop when
its version was stamped and another when it was committed, and a thread asleep in
the store's group commit meanwhile. Under 32 writers that was most of an owner
agent's CPU: its threads spent more time being switched to and from (futexes, the
GIL) than storing, and a critical write's push waited for a thread to be scheduled.

Here a Put is checked and stamped on the loop (`ObjectStore.stamp_small`: a digest
of at most 64 KiB and a clock read, its object's lock taken without waiting), so a
critical write's push starts at once. It then queues for ONE committer thread,
which takes everything queued whenever it is free and commits it as one group
(`ObjectStore.commit_held`: merged, as ever, with what the store's other threads
commit; the objects' locks let go after), and tells the loop every outcome of the
group in one wake-up. Under load the group is whatever queued during the previous
commit, as in the store's own group commit.

A put whose object's lock is held (another write of that object is committing)
takes the old path: a thread waits for the lock in `put_checked`, so an object's
versions still commit in the order they were stamped. A caller that stops waiting
leaves its write to commit, as before. The committer thread stops after `IDLE_S`
without work and is started again by the next put.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading

from agents.store import CheckedSmall, HeldPut, ObjectStore, SmallPut
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError
from controlplane.logs import get_logger

log = get_logger("meridian.agent.store")

# A stamped put, the future of its commit, and the loop that waits for it.
_Queued = tuple[HeldPut, "asyncio.Future[Version]", asyncio.AbstractEventLoop]
_Outcome = Version | Exception
# The future of a commit, its loop, and the commit's outcome.
_Told = tuple["asyncio.Future[Version]", asyncio.AbstractEventLoop, _Outcome]

IDLE_S = 5.0  # the committer thread's idle time before it stops


class SmallPuts:
    """See the module docstring."""

    def __init__(self, store: ObjectStore, *, idle_s: float = IDLE_S) -> None:
        self._store = store
        self._idle_s = idle_s
        self._queue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._state = threading.Lock()
        self._running = False
        self.groups = 0  # groups the committer thread committed (for tests)
        self.waited = 0  # puts that found their object's lock held (for tests)

    async def put(self, put: SmallPut) -> tuple[Version, asyncio.Future[Version]]:
        """Stamp `put` and start its commit; returns its version and the future of its
        commit (its version again once durable, or the error that write raised).
        Raises the put's own error (size, digest, name) with nothing stored."""
        loop = asyncio.get_running_loop()
        checked = self._store.check_small(put)  # hashed once, whichever way it commits
        held = self._store.stamp_small(checked)
        if held is None:
            self.waited += 1
            return await self._put_waiting(checked, loop)
        local: asyncio.Future[Version] = loop.create_future()
        self._queue.put((held, local, loop))
        with self._state:
            start, self._running = not self._running, True
        if start:
            try:
                name = f"small puts of {self._store.root}"
                threading.Thread(target=self._commit_queued, name=name, daemon=True).start()
            except BaseException as err:
                # No thread (a thread limit, the interpreter stopping): what is queued
                # is let go and refused, and the next put tries again.
                with self._state:
                    self._running = False
                self._refuse_queued(err)
                raise UnavailableError(
                    f"the small put of {put.dataset}/{put.key} could not be committed: no "
                    f"committer thread ({type(err).__name__}: {err}); nothing was stored"
                ) from err
        return held.version, local

    async def _put_waiting(
        self, checked: CheckedSmall, loop: asyncio.AbstractEventLoop
    ) -> tuple[Version, asyncio.Future[Version]]:
        """`put_checked` in an executor thread (it waits for its object's lock), its
        version returned at its stamp, before the commit is durable."""
        stamped: asyncio.Future[Version] = loop.create_future()

        def tell(version: Version) -> None:
            if not stamped.done():
                stamped.set_result(version)

        def on_stamped(version: Version) -> None:  # in the store's thread
            loop.call_soon_threadsafe(tell, version)

        local = loop.run_in_executor(
            None, functools.partial(self._store.put_checked, checked, on_stamped=on_stamped)
        )

        def ended(done: asyncio.Future[Version]) -> None:
            # Ended before its stamp (refused, or failed): the caller gets its outcome.
            error = None if done.cancelled() else done.exception()
            if stamped.done():
                return
            if done.cancelled():
                stamped.cancel()
            elif error is not None:
                stamped.set_exception(error)
            else:
                stamped.set_result(done.result())

        local.add_done_callback(ended)
        # A cancelled call cancels `stamped` alone: the commit runs on.
        return await stamped, local

    def _commit_queued(self) -> None:
        """The committer thread: commit whatever is queued, as one group, until idle."""
        try:
            while True:
                try:
                    first = self._queue.get(timeout=self._idle_s)
                except queue.Empty:
                    with self._state:
                        if self._queue.empty():
                            self._running = False
                            return
                    continue
                taken = [first]
                while True:
                    try:
                        taken.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                self._commit(taken)
        except BaseException as err:  # a bug: nothing queued may wait for ever
            log.exception("small_puts_committer_failed")
            with self._state:
                self._running = False
            self._refuse_queued(err)
            raise

    def _commit(self, taken: list[_Queued]) -> None:
        held = [h for h, _, _ in taken]
        completed: list[tuple[str, str]] = []
        interrupt: BaseException | None = None
        try:
            outcomes, completed = self._store.commit_held(held)
        except BaseException as err:  # a bug (commit_held answers each write)
            log.exception("small_puts_commit_failed", puts=len(held))
            outcomes = [_unsure(h, err) for h in held]
            interrupt = None if isinstance(err, Exception) else err
        for h in held:
            h.release()  # commit_held did; once more costs nothing, whatever it raised
        self.groups += 1
        told = [(local, loop, o) for (_, local, loop), o in zip(taken, outcomes, strict=True)]
        if completed:
            # Pruned before the writes are answered (as a lone put_small does), in an
            # executor: pruning takes object locks, and one may belong to a put queued
            # behind this group, which only this thread can commit.
            loop = taken[0][2]
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(self._prune_then_tell, loop, completed, told)
        else:
            _tell(told)
        if interrupt is not None:
            raise interrupt

    def _prune_then_tell(
        self,
        loop: asyncio.AbstractEventLoop,
        completed: list[tuple[str, str]],
        told: list[_Told],
    ) -> None:
        def pruned(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.error("small_puts_prune_failed", error=str(done.exception()))
            _tell(told)

        try:
            loop.run_in_executor(None, self._store.prune_sets, completed).add_done_callback(pruned)
        except RuntimeError:  # the executor is shut down: the agent is stopping
            _tell(told)

    def _refuse_queued(self, err: BaseException) -> None:
        """Every queued put let go of and refused (no thread will commit it)."""
        refused: list[_Told] = []
        while True:
            try:
                held, local, loop = self._queue.get_nowait()
            except queue.Empty:
                break
            held.release()
            refused.append((local, loop, _unsure(held, err)))
        _tell(refused)


def _unsure(held: HeldPut, err: BaseException) -> Exception:
    return UnavailableError(
        f"the small put of {held.entry.dataset}/{held.entry.key} at {held.version.hlc} failed "
        f"to commit ({type(err).__name__}: {err}); it may or may not be stored"
    )


def _tell(told: list[_Told]) -> None:
    """Each commit's future told its outcome, on its own loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Version], _Outcome]]] = {}
    for local, loop, outcome in told:
        by_loop.setdefault(loop, []).append((local, outcome))
    for loop, outcomes in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[tuple[asyncio.Future[Version], _Outcome]]) -> None:
    """On the loop: each commit's future gets its outcome (unless its caller left)."""
    for local, outcome in outcomes:
        if local.done():
            continue
        if isinstance(outcome, Exception):
            local.set_exception(outcome)
            local.exception()  # seen: a caller that stopped waiting would log it unawaited
        else:
            local.set_result(outcome)
