"""The periodic tombstone expiry of an agent's store (the spec's `tombstone_retention`):
a delete is kept at least that long so that no older put resurrects the object, and
then forgotten with every version it still holds, so a dataset whose objects come and
go (rotated logs, replaced shards, old checkpoints) does not keep one row per object
it ever held, nor the bytes of the versions before each delete.

Only datasets `expirable` says yes to (the daemon: those the applied policy places).
`confirm` then says, per dataset and batch of candidates, which keys may go. For a
standard dataset, all of them. For a critical one, only those of which every agent
of every copy region is proven to show that very delete or nothing at all
(`SyncReplication.forgettable_deletes`): a takeover adopts a put that a region
missed the delete of unless the new owner still holds that delete
(agents/replication/sync.py), so forgetting it while an agent still shows the older
put could bring an acknowledged delete's object back. A region that cannot be asked
keeps the tombstone for a later pass. Once one region forgot a delete, the others
still prove it: that region holds nothing of the key, which is allowed. Not asked:
a region the placement no longer names (nothing evicts a critical copy from it; see
the report of issue 13).

A pass runs on a worker thread every `interval_s` (the first one `interval_s` after
start: a restart loop costs no scans); the store reads its objects a batch at a time,
so writes go on beside it, and asks `confirm` (on the event loop, where the agent's
calls run) without its lock, at most store.CONFIRM_BATCH keys at a time. A failed
pass is logged and the next one tries again; a failed or slow `confirm` keeps those
keys' tombstones. At stop, a pass still running asks nothing more, the answer it
waits for is cancelled (its batch keeps its tombstones), and `stop()` returns once
the pass's thread has left the store (bounded by `STOP_WAIT_S`): nothing expires
after the agent went on to close its store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable

from agents.metrics import AgentMetrics
from agents.periodic import Periodic
from agents.store import ObjectStore
from controlplane.logs import get_logger

log = get_logger(__name__)

EXPIRY_INTERVAL_S = 3600.0
# How long a pass waits for `confirm` on one batch of one dataset before keeping it: a
# critical batch (store.CONFIRM_BATCH keys, 8 at a time, two listings per copy region)
# whose calls each run into their 5 s deadline takes about 120 s.
CONFIRM_TIMEOUT_S = 300.0
# How long stop() waits for a pass's thread to leave the store once its answer is
# cancelled (the batch under way is a few SQLite transactions).
STOP_WAIT_S = 30.0

Confirm = Callable[[str, list[tuple[str, str]]], Awaitable[set[str]]]


class TombstoneExpiry(Periodic):
    task_name = "meridian-tombstone-expiry"

    def __init__(
        self,
        store: ObjectStore,
        metrics: AgentMetrics,
        expirable: Callable[[str], bool],
        confirm: Confirm,
        *,
        interval_s: float = EXPIRY_INTERVAL_S,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
    ) -> None:
        super().__init__(interval_s)
        self.store = store
        self.metrics = metrics
        self.expirable = expirable
        self.confirm = confirm
        self.confirm_timeout_s = confirm_timeout_s
        # Set at stop: a pass still running on its thread asks nothing more (the agent's
        # replication and channels are closing) and keeps the rest.
        self._closing = threading.Event()
        # The pass's thread (awaited at stop) and the answer it waits for (cancelled).
        self._work: asyncio.Future[int] | None = None
        self._answer: concurrent.futures.Future[set[str]] | None = None

    async def _do_stop(self) -> None:
        self._closing.set()
        answer = self._answer
        if answer is not None:
            answer.cancel()
        await super()._do_stop()
        work = self._work
        if work is not None and not work.done():
            try:
                await asyncio.wait_for(asyncio.shield(work), STOP_WAIT_S)
            except TimeoutError:
                log.warning("tombstone_expiry_stop_timeout", wait_s=STOP_WAIT_S)
            except Exception as err:  # noqa: BLE001 - the pass's own failure, at stop
                log.warning("tombstone_expiry_failed_at_stop", error=f"{err!r}")

    async def expire_once(self) -> int:
        """One pass; how many objects it forgot."""
        loop = asyncio.get_running_loop()

        def confirmed(dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
            # On the pass's worker thread: the answer is worked out on the event loop,
            # within its own timeout (this one only outlives a loop that stopped).
            if self._closing.is_set():
                return set()
            answer = asyncio.run_coroutine_threadsafe(self._confirmed(dataset, deletes), loop)
            self._answer = answer
            if self._closing.is_set():  # stop ran before the answer was there to cancel
                answer.cancel()
            try:
                allowed = answer.result(timeout=self.confirm_timeout_s + 30)
            except (TimeoutError, concurrent.futures.CancelledError):
                answer.cancel()
                return set()
            finally:
                self._answer = None
            # An answer that came once the agent stopped is not applied.
            return set() if self._closing.is_set() else allowed

        # Shielded: cancelling the pass (at stop) leaves the thread to finish its batch,
        # and stop() waits for it.
        self._work = asyncio.ensure_future(
            asyncio.to_thread(
                self.store.expire_tombstones,
                datasets=self._memo(self.expirable),
                confirm=confirmed,
                stopping=self._closing.is_set,
            )
        )
        # Counted as the thread ends (before this pass resumes), also when the pass
        # was cancelled at stop meanwhile.
        self._work.add_done_callback(self._count)
        return await asyncio.shield(self._work)

    def _count(self, work: asyncio.Future[int]) -> None:
        if work.cancelled() or work.exception() is not None:
            return
        expired = work.result()
        self.metrics.tombstones_expired.inc(expired)
        if expired:
            log.info("tombstones_expired", objects=expired)

    async def _confirmed(self, dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        try:
            async with asyncio.timeout(self.confirm_timeout_s):
                return await self.confirm(dataset, deletes)
        except Exception as err:  # noqa: BLE001 - one batch's answer, not the pass
            error = (
                f"no answer within {self.confirm_timeout_s:g} s"
                if isinstance(err, TimeoutError)
                else f"{err!r}"
            )
            log.warning(
                "tombstone_expiry_unconfirmed",
                dataset=dataset,
                tombstones=len(deletes),
                error=error,
            )
            return set()

    @staticmethod
    def _memo(expirable: Callable[[str], bool]) -> Callable[[str], bool]:
        """`expirable` asked once per dataset in a pass (it may plan a policy rule), and
        False where it fails: a dataset the policy cannot place now keeps its tombstones,
        the others expire."""
        known: dict[str, bool] = {}

        def ask(dataset: str) -> bool:
            if dataset not in known:
                try:
                    known[dataset] = expirable(dataset)
                except Exception as err:  # noqa: BLE001 - one dataset's answer, not the pass
                    log.warning("tombstone_expiry_skipped", dataset=dataset, error=str(err))
                    known[dataset] = False
            return known[dataset]

        return ask

    async def _pass(self) -> None:
        await self.expire_once()
