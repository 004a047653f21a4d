"""The periodic tombstone expiry of an agent's store (the spec's `tombstone_retention`):
a delete is kept at least that long so that no older put resurrects the object, and
then forgotten with every version it still holds, so a dataset whose objects come and
go (rotated logs, replaced shards) does not keep one row per object it ever held.

Only datasets `expirable` says yes to: the daemon passes the standard ones. A
critical dataset keeps its tombstones: a takeover adopts a put that a region missed
the delete of unless the owner still holds that delete (agents/replication/sync.py),
so forgetting it there could bring an acknowledged delete's object back.

A pass runs on a worker thread every `interval_s` (the first one `interval_s` after
start: a restart loop costs no scans); the store reads its objects a batch at a time,
so writes go on beside it. A failed pass is logged and the next one tries again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents.metrics import AgentMetrics
from agents.store import ObjectStore
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger

log = get_logger(__name__)

EXPIRY_INTERVAL_S = 3600.0


class TombstoneExpiry(Lifecycle):
    def __init__(
        self,
        store: ObjectStore,
        metrics: AgentMetrics,
        expirable: Callable[[str], bool],
        *,
        interval_s: float = EXPIRY_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"the tombstone expiry interval must be > 0 s, got {interval_s:g}")
        self.store = store
        self.metrics = metrics
        self.expirable = expirable
        self.interval_s = interval_s
        self.passes = 0  # passes completed, failed or not (tests and logs)
        self._task: asyncio.Task[None] | None = None
        self._pass_done = asyncio.Condition()

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="meridian-tombstone-expiry")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def expire_once(self) -> int:
        """One pass; how many objects it forgot."""
        expired = await asyncio.to_thread(
            self.store.expire_tombstones, datasets=self._memo(self.expirable)
        )
        self.metrics.tombstones_expired.inc(expired)
        if expired:
            log.info("tombstones_expired", objects=expired)
        return expired

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

    async def wait_passes(self, count: int) -> None:
        """Until `count` passes have completed (for tests: no sleeping)."""
        async with self._pass_done:
            await self._pass_done.wait_for(lambda: self.passes >= count)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.expire_once()
            except Exception as err:  # noqa: BLE001 - whatever failed, the next pass tries again
                log.warning("tombstone_expiry_failed", error=f"{type(err).__name__}: {err}")
            async with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
