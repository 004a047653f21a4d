"""Operator runbooks: switchover, failover, drain, undrain, pause, resume.

Each runbook is split into `plan_*` (reads only, raises one clear sentence on bad
input, returns a `Plan` naming every rejected candidate and why) and `run_*` (carries
out a plan through guarded transactions and journals each move with the reason
and the operator). The CLI prints the plan, asks, then runs; `--dry-run` stops
after the plan, so nothing is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.coordination.catalog_glue.sources import (
    CatchUpProbe,
    FailoverJournal,
    JournalEntry,
    PlacementSource,
    unmeasured,
)
from controlplane.coordination.orchestration.decide import (
    Move,
    Plan,
    Unmoved,
    candidate_rejection,
    plan_moves,
)
from controlplane.coordination.orchestration.failover import (
    MoveResult,
    MoveTracker,
    apply_move,
    source_dead_guard,
    target_guards,
)
from controlplane.coordination.orchestration.holders import Assessor, prefer_holders
from controlplane.coordination.orchestration.journal import aborted_entry, moved_entry
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.datasets import known_placements
from controlplane.coordination.protocols.ownership import (
    CorruptRecordError,
    Handover,
    Owner,
    Ownership,
    decode_owner,
)
from controlplane.coordination.protocols.view import (
    ClusterView,
    Maintenance,
    RegionState,
    read_view,
    set_maintenance,
    set_region_state,
)
from controlplane.coordination.timeutil import parse_rfc3339, utcnow
from controlplane.domain.placement import Placement
from controlplane.errors import (
    ConflictError,
    InvalidInputError,
    MeridianError,
    NotFoundError,
    OperationTimeoutError,
    RefusedError,
)
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Coordination, KeepAlive, Lease

log = get_logger(__name__)
# The longest wait between two asks of a catch-up probe that could not compare.
UNMEASURED_POLL_MAX_S = 1.0


class SwitchoverAbortedError(OperationTimeoutError):
    """A switchover gave up (its target did not catch up in time, or the runbook's
    lease lapsed); the previous owner was restored. `why` is the journal's clause."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


class NoHandoverError(RefusedError):
    """`switchover --abort` found no switchover in progress for the dataset."""


class NotMovedError(RefusedError):
    """A failover or drain cannot move (or did not move) some datasets away from a region."""

    def __init__(self, what: str, left: list[Unmoved]) -> None:
        self.left = left
        items = "; ".join(f"{u.dataset}: {u.reason}" for u in left)
        super().__init__(f"{what}: {len(left)} dataset(s) not moved ({items})")


NOT_COMMITTED = (
    "its move did not commit (the target's liveness or state changed after the plan "
    "was made); run the command again"
)


@dataclass(frozen=True, slots=True)
class Context:
    """What one runbook invocation reads: the topology and placements, at one instant."""

    view: ClusterView
    jurisdictions: dict[str, str]
    placements: dict[str, Placement]


class Runbooks:
    """The operator's runbooks over etcd and the catalog; `actor` is journaled with each move."""

    def __init__(
        self,
        coord: Coordination,
        source: PlacementSource,
        journal: FailoverJournal,
        probe: CatchUpProbe,
        *,
        actor: str,
        lease_ttl_s: int = 5,
        holdings: Assessor | None = None,
    ) -> None:
        self.coord = coord
        # What the agents hold, for failover's choice and its RPO exposure (issue 13).
        self.holdings = holdings
        self.ownership = Ownership(coord)
        self.source = source
        self.journal = journal
        self.probe = probe
        self.actor = actor
        self.lease_ttl_s = lease_ttl_s
        # failovers started here finish (and journal) even if the command is interrupted
        self.moves = MoveTracker()
        self._lease: Lease | None = None
        self._keepalive: KeepAlive | None = None

    async def _mark_lease(self) -> KeepAlive:
        """The lease this session's handover marks live on, granted on first use and
        renewed while the session runs: if the runbook dies, etcd deletes its marks
        within `lease_ttl_s` and the previous owners' writes resume."""
        if self._keepalive is None or self._keepalive.lost.is_set():
            # One second shorter than the configured TTL: etcd notices an expired lease
            # up to about half a second late, and the freeze must end within one TTL
            # of the runbook's death (a leader change still resets it; see the port).
            self._lease = await self.coord.grant(max(1, self.lease_ttl_s - 1))
            self._keepalive = self.coord.keep_alive(self._lease)
        return self._keepalive

    async def close(self) -> None:
        """Stop renewing the marks' lease and revoke it (idempotent). A mark still
        there (an interrupted switchover that could not remove its own) goes with it."""
        keepalive, self._keepalive = self._keepalive, None
        lease, self._lease = self._lease, None
        if keepalive is not None:
            await keepalive.stop()
        if lease is not None:
            try:
                await self.coord.revoke(lease.id)
            except MeridianError as exc:  # it then expires on its own within its TTL
                log.warning("runbook_lease_not_revoked", lease=f"{lease.id:x}", error=str(exc))

    async def context(self) -> Context:
        """The topology and placements from the policy published in etcd (and the
        datasets announced after it), as the controllers decide; so a runbook works
        while the catalog is down. Only when no policy was ever published (a catalog
        applied to by an older release) do they come from the catalog."""
        view = await read_view(self.coord)
        kv = await self.coord.get(keys.POLICY_CURRENT)
        if kv is not None:
            # An unreadable value raises: deciding from the catalog instead would hide it.
            policy = CompiledPolicy.from_json(kv.value, etcd_revision=kv.mod_revision)
            placements = await known_placements(self.coord, policy)
            return Context(view, dict(policy.regions), {p.dataset: p for p in placements})
        regions, listed = await asyncio.gather(
            asyncio.to_thread(self.source.regions), asyncio.to_thread(self.source.placements)
        )
        return Context(
            view,
            {r.name: r.jurisdiction for r in regions},
            {p.dataset: p for p in listed},
        )

    @staticmethod
    def _region(ctx: Context, region: str, role: str) -> None:
        if region not in ctx.jurisdictions:
            known = ", ".join(sorted(ctx.jurisdictions)) or "none"
            what = f"{role} region" if role else "region"
            raise NotFoundError(f"unknown {what} {region!r}: the applied topology has {known}")

    # -- switchover ------------------------------------------------------------
    async def plan_switchover(self, dataset: str, to: str) -> tuple[Plan, Context]:
        ctx = await self.context()
        placement = ctx.placements.get(dataset)
        if placement is None:
            raise NotFoundError(f"unknown dataset {dataset!r}: no applied policy places it")
        self._region(ctx, to, "target")
        if placement.dataset_class != "critical":
            raise RefusedError(
                f"{dataset} is a standard (active-active) dataset: it has no owner to switch over"
            )
        owner = ctx.view.owners.get(dataset)
        if owner is None:
            raise RefusedError(
                f"{dataset} has no owner yet: its home controller has not claimed it"
            )
        if owner.region == to:
            raise RefusedError(f"{to} already owns {dataset} (epoch {owner.epoch})")
        if owner.handing_over_to is not None:
            raise RefusedError(
                f"{dataset} is already handing over to {owner.handing_over_to}; if the "
                "runbook that began it is stuck, end it with "
                f"`meridian switchover --dataset {dataset} --abort`"
            )
        why = candidate_rejection(placement, to, ctx.view, ctx.jurisdictions, source=owner.region)
        if why is not None:
            raise RefusedError(f"switchover of {dataset} to {to} refused: {why}")
        return Plan(moves=[Move(dataset, owner.region, to, owner.epoch)]), ctx

    async def run_switchover(
        self,
        move: Move,
        *,
        reason: str,
        timeout_s: float,
        poll_s: float = 0.05,
        kind: str = "switchover",
    ) -> MoveResult:
        """Freeze writes, wait for the target to complete every version, move, unfreeze.

        The handover mark lives on this session's lease (see `_mark_lease`). On
        timeout, or if that lease lapses meanwhile, the mark is removed, so the
        previous owner keeps the dataset at its previous epoch, and
        `SwitchoverAbortedError` is raised.
        """
        started = utcnow()
        owner = await self.ownership.get(move.dataset)
        if owner is None or owner.epoch != move.epoch_before or owner.region != move.from_region:
            raise ConflictError(
                f"ownership of {move.dataset} changed since the plan was made; plan again"
            )
        # The target's state as it is now (an operator may have drained or fenced it
        # while this one confirmed), and unchanged at the commit (complete_handover).
        # An active region has no state key (set_region_state): any value is draining,
        # fenced, or unreadable (taken as fenced), none of which takes ownership.
        target_state = await self.coord.get(keys.state(move.to_region))
        if target_state is not None:
            state = target_state.value.decode(errors="replace")
            raise ConflictError(
                f"{move.to_region} is {state} since the plan was made and takes no "
                f"ownership; {move.dataset} stays with {move.from_region}"
            )
        keepalive = await self._mark_lease()
        handover = await self.ownership.begin_handover(
            move.dataset,
            owner,
            move.to_region,
            self.actor,
            lease=keepalive.lease.id,
            kind=kind,
            deadline=started + timedelta(seconds=timeout_s),
        )
        log.info(
            "handover_started",
            dataset=move.dataset,
            to=move.to_region,
            epoch=owner.epoch,
            lease=f"{keepalive.lease.id:x}",
        )
        deadline = time.monotonic() + timeout_s
        missing: list[str] = []
        delay_s = poll_s
        try:
            while True:
                missing = await asyncio.to_thread(
                    self.probe.incomplete_versions, move.dataset, move.to_region
                )
                if not missing or time.monotonic() >= deadline or keepalive.lost.is_set():
                    break
                # A probe that could not compare (etcd or an agent away) fails fast: ask
                # it again ever more slowly, up to a second apart; while it names versions
                # the target is catching up on, keep polling at `poll_s`.
                blind = any(unmeasured(m) for m in missing)
                delay_s = min(delay_s * 2, UNMEASURED_POLL_MAX_S) if blind else poll_s
                await asyncio.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
            if keepalive.lost.is_set():
                raise SwitchoverAbortedError(
                    f"switchover of {move.dataset} to {move.to_region} aborted: this runbook's "
                    "lease on etcd lapsed (etcd unreachable for a whole TTL?), and its handover "
                    f"mark with it; {move.from_region} still owns it at epoch {move.epoch_before}",
                    why="the runbook's lease lapsed while it waited",
                )
            if missing and all(unmeasured(m) for m in missing):
                why = missing[0][1:-1]
                raise SwitchoverAbortedError(
                    f"switchover of {move.dataset} to {move.to_region} aborted: its catch-up "
                    f"could not be checked for {timeout_s:g} s ({why}); "
                    f"{move.from_region} still owns it at epoch {move.epoch_before}",
                    why=f"catch-up not checkable for {timeout_s:g} s: {why}",
                )
            if missing:
                raise SwitchoverAbortedError(
                    f"switchover of {move.dataset} to {move.to_region} aborted: "
                    f"{len(missing)} version(s) were still incomplete there after {timeout_s:g} s; "
                    f"{move.from_region} still owns it at epoch {move.epoch_before}",
                    why=f"{len(missing)} version(s) still incomplete there after {timeout_s:g} s",
                )
            epoch = await self.ownership.complete_handover(
                handover,
                reason=reason,
                actor=self.actor,
                kind=kind,
                target_state_revision=0,  # still no state key: still active
            )
        except BaseException as exc:
            restored = await self.ownership.abort_handover(handover)
            now = None if restored else await self._owner_after_error(move.dataset)
            moved = now is not None and now.epoch > move.epoch_before
            if (
                now is not None
                and moved
                and now.region == move.to_region
                and (now.kind, now.actor) == (kind, self.actor)
            ):
                # The move committed although this side saw an error (a timeout or an
                # interruption after the transaction was sent): journal it as done. Only
                # when the owner record says this runbook made it: an automatic failover
                # to the same target meanwhile is the controller's move, journaled by it.
                result = await self._journal_moved(move, now.epoch, kind, reason, started)
                log.warning(
                    "switchover_committed_despite_error", dataset=move.dataset, error=str(exc)
                )
                if isinstance(exc, Exception):
                    return result
                raise
            # Another mover won (an automatic failover, say): the row and the error say
            # who, not "aborted, the previous owner still owns it".
            superseded = (
                None
                if now is None or not moved
                else f"{now.kind or 'a claim'} by {now.actor or 'another mover'} moved it to "
                f"{now.region} at epoch {now.epoch} meanwhile"
            )
            if superseded is not None:
                why = superseded
            elif isinstance(exc, SwitchoverAbortedError):
                why = exc.why
            else:
                why = f"interrupted ({type(exc).__name__}: {exc})"
            entry = aborted_entry(
                move,
                handover.create_revision,
                kind=kind,
                reason=reason,
                actor=self.actor,
                started=started,
                missing=missing,
                why=why,
                restored=restored,
            )
            await asyncio.to_thread(self.journal.append, entry)
            log.warning("switchover_aborted", dataset=move.dataset, to=move.to_region)
            if superseded is not None and isinstance(exc, Exception):
                raise ConflictError(
                    f"switchover of {move.dataset} to {move.to_region} not done: {superseded}"
                ) from exc
            raise
        return await self._journal_moved(move, epoch, kind, reason, started)

    # -- switchover --abort ------------------------------------------------------
    async def plan_abort_switchover(self, dataset: str) -> Handover:
        """The switchover in progress for `dataset` (its handover mark), or one clear
        refusal when there is none."""
        try:
            handover = await self.ownership.handover(dataset)
        except CorruptRecordError:
            handover = await self._unreadable_mark(dataset)
        if handover is None:
            raise NoHandoverError(
                f"no switchover of {dataset} is in progress (it has no handover mark): "
                "nothing to abort"
            )
        return handover

    async def _unreadable_mark(self, dataset: str) -> Handover | None:
        """An unreadable mark freezes the dataset all the same, so `--abort` ends it too;
        what it journals comes from the owner record instead."""
        kv = await self.coord.get(keys.handover(dataset))
        if kv is None:
            return None
        owner_kv = await self.coord.get(keys.owner(dataset))
        owner = (
            None
            if owner_kv is None
            else decode_owner(dataset, owner_kv.value, owner_kv.mod_revision, None)
        )
        return Handover(
            dataset,
            owner.region if owner is not None else "?",
            "?",
            owner.epoch if owner is not None else 0,
            kv.create_revision,
            lease=kv.lease,
        )

    async def abort_switchover(self, handover: Handover, *, reason: str) -> JournalEntry:
        """End a half-done switchover: remove its mark (only that one: the transaction
        compares its revision), so the previous owner's writes resume at the same
        epoch; journal it as aborted under the id the runbook itself would use, so a
        runbook still alive and this command leave one row between them.

        A runbook still waiting behind the mark then fails its move (the mark it
        compares is gone) and restores nothing, as nothing is left to restore."""
        if not await self.ownership.abort_handover(handover):
            raise ConflictError(
                f"the switchover of {handover.dataset} ended while this command ran "
                "(moved or aborted by its runbook, or its runbook's lease lapsed); "
                "see `meridian history`"
            )
        try:
            started = parse_rfc3339(handover.at)
        except ValueError:
            started = utcnow()
        entry = aborted_entry(
            Move(handover.dataset, handover.from_region, handover.to_region, handover.epoch),
            handover.create_revision,
            kind=handover.kind,
            reason=reason,
            actor=self.actor,
            started=started,
            missing=[],
            why=(
                "ended by an operator with `switchover --abort` "
                f"(the mark was left by {handover.actor or 'an unknown runbook'})"
            ),
            restored=True,
        )
        await asyncio.to_thread(self.journal.append, entry)
        log.warning(
            "switchover_aborted_by_operator",
            dataset=handover.dataset,
            to=handover.to_region,
            epoch=handover.epoch,
            actor=self.actor,
        )
        return entry

    async def _owner_after_error(self, dataset: str) -> Owner | None:
        """The owner now, or None if it cannot be read either (etcd unreachable)."""
        try:
            return await self.ownership.get(dataset)
        except MeridianError:
            return None

    async def _journal_moved(
        self, move: Move, epoch: int, kind: str, reason: str, started: datetime
    ) -> MoveResult:
        entry = moved_entry(
            move,
            epoch,
            kind=kind,
            reason=reason,
            actor=self.actor,
            started_at=started,
            completed_at=utcnow(),
        )
        try:
            await asyncio.to_thread(self.journal.append, entry)
        except MeridianError as exc:
            # The move is committed in etcd: it is not reported failed (a drain would stop
            # at it, an operator retry it) for a catalog that did not answer. The new
            # owner's controller journals it from the owner record (its journal backfill).
            log.warning(
                "journal_deferred",
                dataset=move.dataset,
                epoch=epoch,
                error=str(exc),
                action="the new owner's controller journals it from the owner record",
            )
        log.info(
            "ownership_moved",
            dataset=move.dataset,
            to=move.to_region,
            epoch=epoch,
            kind=kind,
        )
        return MoveResult(move, epoch, entry)

    # -- failover --------------------------------------------------------------
    async def plan_failover(
        self, source: str, *, to: str | None, force: bool
    ) -> tuple[Plan, Context]:
        ctx = await self.context()
        self._region(ctx, source, "source")
        if to is not None:
            self._region(ctx, to, "target")
            if to == source:
                raise InvalidInputError(
                    f"--to {to} is the region being failed over; name another region"
                )
        if ctx.view.is_alive(source) and not force:
            raise RefusedError(
                f"region {source} is still alive (its controller holds the liveness lease); "
                "use a switchover or drain, or pass --force if it is alive but unusable"
            )
        plan = plan_moves(
            ctx.view,
            list(ctx.placements.values()),
            ctx.jurisdictions,
            source=source,
            to=to,
            automatic=False,
        )
        if to is not None and plan.unmoved:
            reasons = "; ".join(f"{u.dataset}: {u.reason}" for u in plan.unmoved)
            raise RefusedError(f"failover of {source} to {to} refused: {reasons}")
        if self.holdings is not None and plan.moves:
            # Prefer the candidates holding every acked version (an operator's --to stands).
            await prefer_holders(
                plan,
                ctx.placements,
                ctx.view,
                ctx.jurisdictions,
                self.holdings,
                keep_target=to is not None,
            )
        return plan, ctx

    async def run_failover(
        self, plan: Plan, ctx: Context, *, reason: str, force: bool
    ) -> list[MoveResult]:
        detected = utcnow()

        async def one(move: Move) -> MoveResult | None:
            # An operator may fail over during maintenance; without --force the source
            # must still be dead when the transaction runs.
            guards = target_guards(move, ctx.view)
            if not force:
                guards.append(source_dead_guard(move))
            return await self.moves.run(
                apply_move(
                    self.ownership,
                    move,
                    guards=guards,
                    kind="failover",
                    reason=reason,
                    actor=self.actor,
                    journal=self.journal,
                    probe=self.probe,
                    detected_at=detected,
                    exposure=plan.exposures.get(move.dataset),
                )
            )

        results = await asyncio.gather(*(one(m) for m in plan.moves))
        return [r for r in results if r is not None]

    # -- drain -----------------------------------------------------------------
    async def plan_drain(self, region: str) -> tuple[Plan, Context]:
        """Planned moves of everything `region` owns (manual-mode datasets too: an
        operator asked for the drain); candidates are home, then failover.order."""
        ctx = await self.context()
        self._region(ctx, region, "")
        plan = plan_moves(
            ctx.view,
            list(ctx.placements.values()),
            ctx.jurisdictions,
            source=region,
            automatic=False,
            move_manual=True,
        )
        return plan, ctx

    async def run_drain(
        self, region: str, plan: Plan, *, reason: str, timeout_s: float
    ) -> tuple[list[MoveResult], list[Unmoved]]:
        """Mark `region` draining, then switch each planned dataset over in turn.

        A switchover that aborts (its target did not catch up), loses a race, or meets
        an error on the way (etcd or the catalog not answering for a moment) does not
        stop the others: the drain moves everything it can and returns, beside the
        moves, each dataset it could not move with why (runbooks.md).
        """
        # Draining first: from now on the region takes no new ownership.
        await set_region_state(self.coord, region, RegionState.DRAINING)
        results: list[MoveResult] = []
        failed: list[Unmoved] = []
        for m in plan.moves:
            try:
                results.append(
                    await self.run_switchover(m, reason=reason, timeout_s=timeout_s, kind="drain")
                )
            except MeridianError as exc:
                failed.append(Unmoved(m.dataset, str(exc)))
        return results, failed

    async def left_behind(
        self, region: str, plan: Plan, failed: Sequence[Unmoved] = ()
    ) -> list[Unmoved]:
        """The datasets `region` still owns after a failover or drain ran, with why:
        the run's or the plan's reason for those it could not move, else that the
        move did not commit."""
        view = await read_view(self.coord)
        why = {u.dataset: u.reason for u in (*plan.unmoved, *failed)}
        retired = {u.dataset for u in plan.retired}  # nothing to move: not left behind
        return [
            Unmoved(d, why.get(d, NOT_COMMITTED)) for d in view.owned_by(region) if d not in retired
        ]

    async def undrain(self, region: str) -> None:
        ctx = await self.context()
        self._region(ctx, region, "")
        await set_region_state(self.coord, region, RegionState.ACTIVE)

    async def pause(self, reason: str) -> Maintenance | None:
        """Pause automatic failover; the earlier pause (left as it was) if already paused."""
        return await set_maintenance(self.coord, True, reason=reason, actor=self.actor)

    async def resume(self) -> None:
        await set_maintenance(self.coord, False, reason="", actor=self.actor)
