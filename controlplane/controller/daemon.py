"""The region controller: one active per region, elected through etcd.

Lifecycle (aiokafka-style): `start()` refuses to run twice, `stop()` is idempotent,
`async with` works, every task is owned and awaited. While active, the
controller:

* holds the region's election lock and, under the same lease, the liveness key
  `/meridian/regions/<region>/alive`;
* claims every critical dataset homed in its region that has no owner (on start,
  on every `/meridian/policy/current` change, and every `reconcile_interval_s`);
* watches liveness keys: when another region's key is deleted and maintenance
  mode is off, it races one guarded transaction per dataset of that region to
  its successor (exactly one racer wins each; see `coordination.failover`);
* tracks the datasets its region owns (an ownership watch) and, with a fence
  directory, writes a canary through `FencedResource` for each, so a paused
  controller that wakes up after losing ownership is refused and steps down.

Losing the lease (keepalive reports it gone) cancels all of that: the
controller logs `step_down`, forgets what it owned and campaigns again.
Every decision is one structured log event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from controlplane.controller.metrics import ControllerMetrics
from controlplane.coordination.catalog_glue.sources import (
    CatchUpProbe,
    FailoverJournal,
    PlacementSource,
    journal_id,
)
from controlplane.coordination.orchestration.decide import plan_moves
from controlplane.coordination.orchestration.failover import (
    MoveTracker,
    apply_move,
    automatic_guards,
)
from controlplane.coordination.orchestration.journal import backfilled_entry
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    DirectoryEpochs,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.follow import follow_ownership
from controlplane.coordination.protocols.locks import GlobalLock, HeldLock, LockLostError
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.protocols.view import RegionState, read_view
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.domain.placement import Placement
from controlplane.errors import ConflictError, MeridianError, NotFoundError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Cmp, Compare, Coordination, EventType, Put, Target

log = get_logger("meridian.controller")


@dataclass(frozen=True)
class ControllerConfig:
    region: str
    controller_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_ttl_s: int = 5
    reconcile_interval_s: float = 1.0
    canary_interval_s: float = 0.2
    fence_dir: Path | None = None
    # A move whose journal row is still missing this long after it was first seen
    # missing is journaled from its owner record (the mover crashed in between).
    journal_grace_s: float = 15.0
    # How long a stop waits for moves already started to write their journal rows.
    stop_grace_s: float = 10.0
    journal_check_interval_s: float = 5.0


class RegionController:
    """One region controller; see the module docstring."""

    def __init__(
        self,
        coord: Coordination,
        source: PlacementSource,
        journal: FailoverJournal,
        probe: CatchUpProbe | None,
        config: ControllerConfig,
    ) -> None:
        self.coord = coord
        self.ownership = Ownership(self.coord)
        self.source = source
        self.journal = journal
        self.probe = probe
        self.config = config
        self.moves = MoveTracker()
        self.metrics = ControllerMetrics(config.region)
        self.fence = FencedResource(DirectoryEpochs(config.fence_dir)) if config.fence_dir else None
        self.active = asyncio.Event()
        self.owned: dict[str, int] = {}
        self._placements: list[Placement] = []
        self._jurisdictions: dict[str, str] = {}
        self._held: HeldLock | None = None
        self._alive_create_revision = 0
        self._active_since = 0.0
        self._wake = asyncio.Event()
        self._next_journal_check = 0.0
        self._journal_missing_since: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopping = False
        self.actor = f"controller {config.region}/{config.controller_id}"

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Check the region exists, then run in the background; refuses a second start."""
        if self._started:
            raise RuntimeError("controller already started")
        await self._load_placements()
        if self.config.region not in self._jurisdictions:
            known = ", ".join(sorted(self._jurisdictions)) or "none (apply a policy first)"
            raise NotFoundError(
                f"region {self.config.region!r} is not in the applied topology (it has: {known})"
            )
        self._started = True
        self._task = asyncio.create_task(self._run(), name=f"controller-{self.config.region}")
        log.info("controller_started", region=self.config.region, id=self.config.controller_id)

    async def stop(self) -> None:
        """Stop, revoking the lease so a standby (or a failover) need not wait a TTL."""
        if self._stopping or self._task is None:
            return
        self._stopping = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        # Moves whose transaction was sent finish, so each committed one has its row.
        left = await self.moves.finish(timeout_s=self.config.stop_grace_s)
        if left:
            log.warning("stopped_with_moves_in_flight", region=self.config.region, moves=left)
        self.active.clear()
        self.metrics.active.set(0)
        log.info("controller_stopped", region=self.config.region, id=self.config.controller_id)

    async def wait(self) -> None:
        """Until the controller stops (or fails with an error, which is raised)."""
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    # -- main loop -----------------------------------------------------------------
    async def _run(self) -> None:
        election = GlobalLock(
            self.coord,
            f"controller-{self.config.region}",
            ttl_s=self.config.lease_ttl_s,
            prefix=keys.election(self.config.region),
        )
        value = json.dumps({"id": self.config.controller_id}).encode()
        while True:
            try:
                async with election.hold(value=value) as held:
                    await self._serve(held)
            except LockLostError as exc:
                self._step_down(str(exc))
            except MeridianError as exc:
                # etcd unreachable or a race: campaign again after a short pause.
                self._step_down(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(min(1.0, self.config.lease_ttl_s / 5))

    def _step_down(self, why: str) -> None:
        if self.active.is_set():
            self.metrics.step_downs.inc()
        log.warning("step_down", region=self.config.region, id=self.config.controller_id, why=why)
        self.active.clear()
        self.owned.clear()
        self._held = None
        self.metrics.active.set(0)
        self.metrics.owned.set(0)

    async def _serve(self, held: HeldLock) -> None:
        self._held = held
        alive_value = json.dumps(
            {"controller": self.config.controller_id, "since": rfc3339(utcnow())}
        ).encode()
        res = await self.coord.txn(
            [], [Put(keys.alive(self.config.region), alive_value, held.lease.id)]
        )
        self._alive_create_revision = 0
        kv = await self.coord.get(keys.alive(self.config.region))
        if kv is None or kv.lease != held.lease.id:
            raise LockLostError("our liveness key vanished right after it was written")
        self._alive_create_revision = kv.create_revision
        self._active_since = time.monotonic()
        view = await read_view(self.coord)
        self.owned = {d: o.epoch for d, o in view.owners.items() if o.region == self.config.region}
        for d, e in self.owned.items():
            self._observe_epoch(d, e)
        self.metrics.owned.set(len(self.owned))
        self.active.set()
        self.metrics.active.set(1)
        log.info(
            "became_active",
            region=self.config.region,
            id=self.config.controller_id,
            lease=f"{held.lease.id:x}",
            owns=len(self.owned),
            revision=res.revision,
        )
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._watch_owners(view.revision + 1))
                tg.create_task(self._watch_regions(view.revision + 1))
                tg.create_task(self._watch_policy(view.revision + 1))
                tg.create_task(self._reconcile_loop())
                if self.fence is not None:
                    # The fence learns epochs and handover freezes from etcd itself,
                    # as an agent's would, not only from what this controller owns.
                    tg.create_task(follow_ownership(self.coord, self.fence))
                    tg.create_task(self._canary_loop())
        except ExceptionGroup as group:
            # A dependency failed in one duty (etcd unreachable, a watch compacted):
            # surface it as itself so `_run` steps down and campaigns again.
            first = _first_meridian_error(group)
            if first is None:
                raise
            raise first from group

    # -- placements --------------------------------------------------------------
    async def _load_placements(self) -> None:
        regions, placements = await asyncio.gather(
            asyncio.to_thread(self.source.regions), asyncio.to_thread(self.source.placements)
        )
        self._jurisdictions = {r.name: r.jurisdiction for r in regions}
        self._placements = placements

    async def _watch_policy(self, start: int) -> None:
        async for _ev in self.coord.watch(keys.POLICY_CURRENT, start_revision=start):
            log.info("policy_changed", region=self.config.region)
            self._wake.set()

    async def _reconcile_loop(self) -> None:
        while True:
            await self._load_placements()
            await self._claim_unowned()
            await self._sweep_dead_regions()
            await self.backfill_journal()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.reconcile_interval_s):
                    await self._wake.wait()

    async def _claim_unowned(self) -> None:
        view = await read_view(self.coord)
        me = self.config.region
        if view.state_of(me) is not RegionState.ACTIVE:
            return
        todo = [
            p.dataset
            for p in self._placements
            if p.dataset_class == "critical" and p.home == me and p.dataset not in view.owners
        ]
        guards = [
            Compare(keys.alive(me), Target.CREATE, Cmp.EQUAL, self._alive_create_revision),
            Compare(keys.state(me), Target.MOD, Cmp.EQUAL, view.state_revisions.get(me, 0)),
        ]
        # Claims are independent transactions: run them concurrently (bounded), so a
        # WAN round trip is paid once per batch, not once per dataset.
        limit = asyncio.Semaphore(32)

        async def claim(dataset: str) -> None:
            async with limit:
                try:
                    epoch = await self.ownership.claim(
                        dataset,
                        me,
                        expect_epoch=0,
                        reason="home region claims an unowned dataset",
                        actor=self.actor,
                        guards=guards,
                    )
                except ConflictError:
                    log.info("claim_lost", dataset=dataset, region=me)
                    return
            self.metrics.claims.inc()
            self._gain(dataset, epoch)
            log.info("claimed", dataset=dataset, region=me, epoch=epoch)

        async with asyncio.TaskGroup() as tg:
            for dataset in todo:
                tg.create_task(claim(dataset))

    # -- ownership tracking ----------------------------------------------------------
    def _observe_epoch(self, dataset: str, epoch: int) -> None:
        if self.fence is not None:
            self.fence.observe(dataset, epoch)

    def _gain(self, dataset: str, epoch: int) -> None:
        if self.owned.get(dataset, 0) < epoch:
            self.owned[dataset] = epoch
            self._observe_epoch(dataset, epoch)
            self.metrics.owned.set(len(self.owned))

    async def _watch_owners(self, start: int) -> None:
        async for dataset, owner in self.ownership.watch(start):
            if owner is not None and owner.region == self.config.region:
                self._gain(dataset, owner.epoch)
            elif dataset in self.owned:
                del self.owned[dataset]
                self.metrics.owned.set(len(self.owned))
                log.info(
                    "ownership_lost",
                    dataset=dataset,
                    region=self.config.region,
                    to=owner.region if owner else None,
                    epoch=owner.epoch if owner else None,
                )

    async def _canary_loop(self) -> None:
        fence = self.fence
        if fence is None:
            return
        seq = 0
        while True:
            await asyncio.sleep(self.config.canary_interval_s)
            seq += 1
            for dataset, epoch in list(self.owned.items()):
                try:
                    await asyncio.to_thread(
                        fence.write,
                        dataset,
                        epoch,
                        {"seq": seq, "region": self.config.region},
                        self.config.controller_id,
                    )
                except DatasetHandingOverError:
                    continue
                except StaleEpochError as exc:
                    self.metrics.fenced.inc()
                    self.owned.pop(dataset, None)
                    self.metrics.owned.set(len(self.owned))
                    log.warning(
                        "fenced",
                        dataset=dataset,
                        region=self.config.region,
                        epoch=epoch,
                        error=str(exc),
                        action="stepping down from this dataset",
                    )

    # -- journal backfill -------------------------------------------------------------
    async def backfill_journal(self, *, force: bool = False, now: float | None = None) -> int:
        """Journal every move into this region whose journal row is missing; how many.

        A mover (a controller or a runbook) that crashes between winning the ownership
        transaction and appending its journal row would lose the row. The owner record
        keeps the move's kind, source, reason, actor and time, and the row's id is
        deterministic (`dataset@epoch`), so the new owner's controller rebuilds it.
        A row is only rebuilt once it has been missing for `journal_grace_s`, so a
        mover still about to write it (with its RPO exposure) is not pre-empted; a
        race is harmless anyway, as appends are idempotent on the id. `force` skips
        the check interval; `now` (a `time.monotonic()` value) lets tests age rows.
        """
        now = time.monotonic() if now is None else now
        if not force and now < self._next_journal_check:
            return 0
        self._next_journal_check = now + self.config.journal_check_interval_s
        view = await read_view(self.coord)
        moves = {
            journal_id(d, o.epoch): o
            for d, o in view.owners.items()
            if o.region == self.config.region and o.kind is not None
        }
        missing = await asyncio.to_thread(self.journal.missing, list(moves)) if moves else set()
        self._journal_missing_since = {
            i: t for i, t in self._journal_missing_since.items() if i in missing
        }
        written = 0
        for jid in sorted(missing):
            first = self._journal_missing_since.setdefault(jid, now)
            if now - first < self.config.journal_grace_s:
                continue
            entry = backfilled_entry(moves[jid], self.actor)
            try:
                await asyncio.to_thread(self.journal.append, entry)
            except MeridianError as exc:
                log.warning("journal_backfill_failed", id=jid, error=str(exc))
                continue
            del self._journal_missing_since[jid]
            written += 1
            log.warning(
                "journal_backfilled",
                dataset=entry.dataset,
                epoch=entry.epoch,
                kind=entry.kind,
                from_region=entry.from_region,
                to=entry.to_region,
            )
        return written

    # -- failover -------------------------------------------------------------------
    async def _watch_regions(self, start: int) -> None:
        async for ev in self.coord.watch(keys.REGIONS, prefix=True, start_revision=start):
            parsed = keys.region_of(ev.kv.key)
            if ev.type is not EventType.DELETE or parsed is None or parsed[1] != "alive":
                continue
            region = parsed[0]
            if region == self.config.region:
                continue
            log.info("region_lease_expired", region=region, observer=self.config.region)
            await self.fail_over(region, detected_at_monotonic=time.monotonic())

    async def _sweep_dead_regions(self) -> None:
        # Catch-up for deletions we could not see (we were not active yet), once we
        # have been active for a whole TTL, so a cold start does not grab everything.
        if time.monotonic() - self._active_since < self.config.lease_ttl_s + 1:
            return
        view = await read_view(self.coord)
        dead = {o.region for o in view.owners.values() if not view.is_alive(o.region)}
        for region in sorted(dead - {self.config.region}):
            await self.fail_over(region, detected_at_monotonic=time.monotonic(), quiet=True)

    async def fail_over(
        self, region: str, *, detected_at_monotonic: float, quiet: bool = False
    ) -> int:
        """Race every dataset of a dead `region` to its successor; returns how many we won.

        `quiet` (the periodic sweep) logs nothing when there is nothing to move, so a
        dataset in manual mode is reported once per death, not once per second.
        """
        detected = utcnow()
        view = await read_view(self.coord)
        if view.maintenance:
            if not quiet:
                log.warning("failover_paused", region=region, reason="maintenance mode is on")
            return 0
        if view.is_alive(region):
            log.info("failover_skipped", region=region, reason="the region is alive again")
            return 0
        plan = plan_moves(
            view, self._placements, self._jurisdictions, source=region, automatic=True
        )
        if quiet and not plan.moves:
            return 0
        for r in plan.rejected:
            log.info(
                "failover_candidate_rejected",
                dataset=r.dataset,
                candidate=r.region,
                reason=r.reason,
            )
        for u in plan.unmoved:
            log.warning("failover_not_moved", dataset=u.dataset, region=region, reason=u.reason)
        results = await asyncio.gather(
            *(
                self.moves.run(
                    apply_move(
                        self.ownership,
                        m,
                        guards=automatic_guards(m, view),
                        kind="automatic",
                        reason="lease expired",
                        actor=self.actor,
                        journal=self.journal,
                        probe=self.probe,
                        detected_at=detected,
                        started_at=detected,
                    )
                )
                for m in plan.moves
            ),
            return_exceptions=True,
        )
        won = 0
        for m, outcome in zip(plan.moves, results, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("failover_move_failed", dataset=m.dataset, error=str(outcome))
            elif outcome is not None:
                won += 1
        self.metrics.failovers.inc(won)
        if plan.moves:
            self.metrics.failover_seconds.observe(time.monotonic() - detected_at_monotonic)
        log.info("failover_done", region=region, moves=len(plan.moves), won=won)
        return won


def _first_meridian_error(group: BaseExceptionGroup[BaseException]) -> MeridianError | None:
    for exc in group.exceptions:
        if isinstance(exc, MeridianError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            inner = _first_meridian_error(exc)
            if inner is not None:
                return inner
    return None
