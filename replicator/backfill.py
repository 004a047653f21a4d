"""Policy changes take effect live: a dataset that gains this region as a replica is
backfilled at once.

The change log only carries writes made after the event; objects written before
this region was a replica never come through it. So the daemon follows the policy
view, and when a new revision places a standard dataset in this region that the
previous one did not, it runs the resync of that dataset (resync.py: the catalog's
newest version of every object the region lacks, fetched from its holders by the
agent, by LWW). A region removed, or a residency narrowed, needs nothing here: the
residency guard reads the current snapshot at every event, so no further copy is
made there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from controlplane.catalog.records import Placement
from controlplane.errors import OperationTimeoutError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy, PolicyView
from replicator.ports import AgentPort
from replicator.resync import AgentsOf, ResyncCatalog, drive_resync, plan_resync

log = get_logger("meridian.replicator.backfill")


def newly_placed(
    before: Mapping[str, Placement], after: Mapping[str, Placement], region: str
) -> list[Placement]:
    """Standard datasets `after` places in `region` and `before` did not, by name."""

    def here(p: Placement | None) -> bool:
        return p is not None and p.dataset_class == "standard" and region in p.regions

    return [p for name, p in sorted(after.items()) if here(p) and not here(before.get(name))]


def _changed_from(seen: CompiledPolicy | None) -> Callable[[CompiledPolicy | None], bool]:
    def changed(p: CompiledPolicy | None) -> bool:
        return p is not None and p is not seen

    return changed


class Backfill(Lifecycle):
    def __init__(
        self,
        view: PolicyView,
        catalog: ResyncCatalog,
        agent: AgentPort,
        agents_of: AgentsOf,
        region: str,
    ) -> None:
        self._view = view
        self._catalog = catalog
        self._agent = agent
        self._agents_of = agents_of
        self._region = region
        self._task: asyncio.Task[None] | None = None
        self.runs = 0
        self.ran = asyncio.Event()  # set after each backfill, failed or not

    async def _do_start(self) -> None:
        # The snapshot at start, taken now: a revision published before the task first
        # runs is then still a change.
        self._task = asyncio.create_task(self._run(self._view.current), name="replicator-backfill")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self, seen: CompiledPolicy | None) -> None:
        while True:
            try:
                await self._view.wait_for(_changed_from(seen), 3600)
            except OperationTimeoutError:
                continue  # an hour without a new revision: wait again
            current = self._view.current
            if current is None:
                continue
            added = newly_placed(seen.placements if seen else {}, current.placements, self._region)
            seen = current
            if added:
                await self.backfill(current, added)

    async def backfill(self, policy: CompiledPolicy, placements: list[Placement]) -> None:
        try:
            await self._backfill(policy, placements)
        finally:
            self.ran.set()

    async def _backfill(self, policy: CompiledPolicy, placements: list[Placement]) -> None:
        names = [p.dataset for p in placements]
        try:
            items = await asyncio.to_thread(plan_resync, self._catalog, placements, self._region)
            log.info("backfill_started", region=self._region, datasets=names, versions=len(items))
            results = await drive_resync(
                items,
                region=self._region,
                agent=self._agent,
                records=self._catalog,
                policy=policy,
                agents_of=self._agents_of,
            )
        except Exception as exc:  # noqa: BLE001 - resync can finish it; the daemon goes on
            log.warning(
                "backfill_failed",
                region=self._region,
                datasets=names,
                error=str(exc),
                action="run `meridian replication resync` for these datasets",
            )
            return
        self.runs += 1
        failed = [r for r in results if r.outcome == "failed"]
        log.info(
            "backfill_done",
            region=self._region,
            datasets=names,
            versions=len(results),
            failed=len(failed),
        )
