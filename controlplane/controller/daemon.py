"""The region controller: one active per region, elected through etcd; this module wires it.

The controller is a `Lifecycle` made of small components, each in its own module:

* `PolicyView` (`policy/current.py`): the applied policy, watched in etcd. Every
  decision below is taken on it, never on the catalog.
* `Election` (`election.py`): campaigns for the region's lock and, under the same
  lease, holds the liveness key `/meridian/regions/<region>/alive`. While a term
  lasts, three duties run for it, started in this order and stopped in reverse:
  - `OwnershipTracker` (`ownership.py`): the datasets this region owns, and the
    fence canary that makes a controller paused past its lease step down;
  - `Claims` (`claims.py`): claims the unowned critical datasets homed here;
  - `FailoverWatch` (`failover_watch.py`): fails a dead region's datasets over.
* `JournalDuty` (`journal.py`), for the controller's whole life: writes journal
  rows deferred by a catalog outage (`records.py`) and backfills rows of moves
  whose mover crashed.

A duty's error never ends the process: it is logged and retried with backoff
(`duty.py`). Only a lost lease ends a term: the controller logs `step_down`,
forgets what it owned and campaigns again. A transient etcd error does not give
the lease up, and a catalog outage changes nothing but when rows are written.
Every decision is one structured log event.
"""

from __future__ import annotations

import asyncio

from controlplane.controller.claims import Claims
from controlplane.controller.config import ControllerConfig, ControllerContext, Term
from controlplane.controller.duty import describe
from controlplane.controller.election import Election
from controlplane.controller.failover_watch import FailoverWatch
from controlplane.controller.journal import JournalDuty
from controlplane.controller.metrics import ControllerMetrics
from controlplane.controller.ownership import OwnershipTracker
from controlplane.controller.records import CatalogRecords
from controlplane.coordination.catalog_glue.sources import CatchUpProbe, FailoverJournal
from controlplane.coordination.orchestration.failover import MoveTracker
from controlplane.coordination.orchestration.holders import Assessor
from controlplane.coordination.protocols.fencing import DirectoryEpochs, FencedResource
from controlplane.errors import NotFoundError
from controlplane.lifecycle import Lifecycle
from controlplane.logs import get_logger
from controlplane.policy.current import PolicyView
from controlplane.ports.coordination import Coordination

__all__ = ["ControllerConfig", "RegionController"]

log = get_logger("meridian.controller")


class RegionController(Lifecycle):
    """One region controller; see the module docstring.

    `view` may be shared with other components of the process; when it is not
    given the controller runs its own."""

    def __init__(
        self,
        coord: Coordination,
        journal: FailoverJournal,
        probe: CatchUpProbe | None,
        config: ControllerConfig,
        *,
        view: PolicyView | None = None,
        holdings: Assessor | None = None,
    ) -> None:
        self.config = config
        self.view = view if view is not None else PolicyView(coord)
        self._own_view = view is None
        self.ctx = ControllerContext(
            coord=coord,
            config=config,
            view=self.view,
            metrics=ControllerMetrics(config.region),
            records=CatalogRecords(journal, probe),
            moves=MoveTracker(),
            fence=FencedResource(DirectoryEpochs(config.fence_dir)) if config.fence_dir else None,
            actor=f"controller {config.region}/{config.controller_id}",
            holdings=holdings,
        )
        self.metrics = self.ctx.metrics
        self.actor = self.ctx.actor
        self.active = asyncio.Event()
        self.journal = JournalDuty(self.ctx)
        self.election = Election(self.ctx, self._serve, self._step_down)
        self._tracker: OwnershipTracker | None = None
        self._failover: FailoverWatch | None = None
        self._stepped_down = False  # whether a term (or a campaign) of this controller ended
        self._done = asyncio.Event()

    @property
    def owned(self) -> dict[str, int]:
        """Datasets this region owns, with their epochs (empty while not active)."""
        return self._tracker.owned if self._tracker is not None else {}

    # -- lifecycle -------------------------------------------------------------------
    async def _do_start(self) -> None:
        """Check the region is in the applied topology, then run in the background."""
        if self._own_view:
            await self.view.start()
        policy = self.view.current
        if policy is None or self.config.region not in policy.regions:
            known = ", ".join(sorted(policy.regions)) if policy else ""
            raise NotFoundError(
                f"region {self.config.region!r} is not in the applied topology "
                f"(it has: {known or 'none (apply a policy first)'})"
            )
        await self.journal.start()
        await self.election.start()
        log.info("controller_started", region=self.config.region, id=self.config.controller_id)

    async def _do_stop(self) -> None:
        """Stop, revoking the lease so a standby (or a failover) need not wait a TTL."""
        await self.election.stop()
        # Moves whose transaction was sent finish, so each committed one has its row.
        left = await self.ctx.moves.finish(timeout_s=self.config.stop_grace_s)
        if left:
            log.warning("stopped_with_moves_in_flight", region=self.config.region, moves=left)
        await self.journal.stop()
        await self._last_flush()
        if self._own_view:
            await self.view.stop()
        self.active.clear()
        self.metrics.active.set(0)
        log.info("controller_stopped", region=self.config.region, id=self.config.controller_id)
        self._done.set()

    async def _last_flush(self) -> None:
        records = self.ctx.records
        if not records.pending:
            return
        try:
            async with asyncio.timeout(self.config.stop_grace_s):
                await asyncio.to_thread(records.flush)
        except Exception as exc:  # noqa: BLE001 - said in the log; the backfill rebuilds them
            log.error(
                "stopped_with_journal_deferred",
                region=self.config.region,
                rows=sorted(records.pending_ids()),
                error=describe(exc),
                action="the new owner's controller journals them from the owner records",
            )

    async def wait(self) -> None:
        """Until the controller is stopped."""
        if self.running:
            await self._done.wait()

    # -- terms ---------------------------------------------------------------------------
    async def _serve(self, term: Term) -> None:
        tracker = OwnershipTracker(self.ctx)
        claims = Claims(self.ctx, term, tracker)
        # A term that follows an earlier one most likely follows an etcd outage that
        # ended the other regions' terms too, however long this campaign took: see
        # FailoverWatch.recovering. (A bound on the time since the step-down missed
        # terms whose lease grant hung through the outage for longer than a TTL.) So
        # is a term taken over from another controller of this region, which gave way
        # as its own term ended by its own count: most often an outage too, or a stall.
        recovering = self._stepped_down or term.took_over
        failover = FailoverWatch(self.ctx, term, recovering=recovering)
        self.ctx.term = term
        self._tracker, self._failover = tracker, failover
        self.active.set()
        self.metrics.active.set(1)
        try:
            async with tracker, claims, failover:
                await asyncio.Future()  # until the lease is lost or the controller stops
        finally:
            self.ctx.term = None

    def _step_down(self, why: str) -> None:
        if self.active.is_set():
            self.metrics.step_downs.inc()
            log.warning(
                "step_down", region=self.config.region, id=self.config.controller_id, why=why
            )
        else:
            # A campaign that failed (etcd unreachable, or the lease lost before the term
            # began): no term ended, so no `step_down`, which operators and the chaos
            # checks read as one. The election logs the retry itself.
            log.info(
                "campaign_ended", region=self.config.region, id=self.config.controller_id, why=why
            )
        # Either way this controller saw etcd fail: most likely an outage that ended the
        # other regions' terms too, so its next term starts recovering (see _serve).
        self._stepped_down = True
        self.active.clear()
        self._tracker = self._failover = None
        self.metrics.active.set(0)
        self.metrics.owned.set(0)

    # -- for tests and tools ---------------------------------------------------------------
    async def backfill_journal(self, *, force: bool = False, now: float | None = None) -> int:
        """Run the journal backfill now (see `JournalDuty.backfill`)."""
        return await self.journal.backfill(force=force, now=now)

    async def fail_over(self, region: str, *, detected_at_monotonic: float) -> int:
        """Fail `region` over now, as the failover watch would; 0 while not active."""
        failover = self._failover
        if failover is None:
            return 0
        return await failover.fail_over(region, detected_at_monotonic=detected_at_monotonic)
