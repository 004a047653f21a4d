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
from agents.periodic import Periodic
from agents.store import ObjectStore
from controlplane.logs import get_logger

log = get_logger(__name__)

EXPIRY_INTERVAL_S = 3600.0


class TombstoneExpiry(Periodic):
    task_name = "meridian-tombstone-expiry"

    def __init__(
        self,
        store: ObjectStore,
        metrics: AgentMetrics,
        expirable: Callable[[str], bool],
        *,
        interval_s: float = EXPIRY_INTERVAL_S,
    ) -> None:
        super().__init__(interval_s)
        self.store = store
        self.metrics = metrics
        self.expirable = expirable

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

    async def _pass(self) -> None:
        await self.expire_once()
