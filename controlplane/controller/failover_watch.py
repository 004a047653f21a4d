"""Failover watch: when another region's liveness lease expires, race its datasets away.

For one term. The `regions` loop watches liveness keys; on the deletion of
another region's key (and with maintenance mode off) it races one guarded
transaction per dataset of that region to its successor (exactly one racer wins
each; see `coordination.orchestration.failover`). The `sweep` loop catches deletions the watch
could not see (before this term, or while etcd was unreachable), once the term
is a whole TTL old so that a cold start does not grab everything. In a term that
follows an earlier one of this controller (an etcd outage, most often), the watch
leaves deletions seen while the term settles to the sweep, and the sweep moves only
a region it has seen dead for a TTL and a second in a row (one that can reach etcd
writes its key again within a TTL); see `recovering`.

Placements and jurisdictions come from the policy in etcd (`PolicyView`) and the
datasets announced there after the apply (`protocols.datasets`); with no
policy applied nothing moves (fail closed). Among the live candidates the
one that holds every acked version is preferred, from what the agents publish in
etcd (`prefer_holders`, `holdings_choice.py`), and the RPO exposure journaled is
what the agents said the new owner lacks (the catalog's measure only when no agent
published anything). A move's journal row goes through `CatalogRecords`, so a
catalog outage delays the row, never the move.
"""

from __future__ import annotations

import asyncio
import time

from controlplane.controller.config import ControllerContext, Term
from controlplane.controller.duty import Duty, Loop, describe
from controlplane.coordination.orchestration.decide import plan_moves
from controlplane.coordination.orchestration.failover import apply_move, automatic_guards
from controlplane.coordination.orchestration.holders import prefer_holders
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.datasets import known_placements
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.protocols.view import read_view
from controlplane.coordination.timeutil import utcnow
from controlplane.logs import get_logger
from controlplane.ports.coordination import EventType

log = get_logger("meridian.controller")


class FailoverWatch(Duty):
    name = "failover"

    def __init__(self, ctx: ControllerContext, term: Term, *, recovering: bool = False) -> None:
        super().__init__(ctx.config.region, **ctx.retry())
        self.ctx = ctx
        self.term = term
        # This term follows an earlier one of this controller (most often one ended
        # for lack of etcd). A quorum loss ends every region's term at once; each then
        # writes its liveness key again, in some order, and the old keys vanish as
        # etcd expires their leases (a TTL and an election timeout after its new
        # leader). A deletion seen while such a term settles is most likely that
        # outage, not a dead region, so the watch leaves it to the sweep, which moves
        # a region only once it has stayed dead for a TTL and a second. Found by chaos
        # scenario 6: eu-west, back 0.1 s before eu-central, failed it over; later
        # eu-north did, in a term whose campaign alone had outlasted a TTL.
        self.recovering = recovering
        self._dead_since: dict[str, float] = {}  # region -> when the sweep first saw it dead

    def loops(self) -> dict[str, Loop]:
        return {"regions": self._watch_regions, "sweep": self._sweep_loop}

    async def _watch_regions(self) -> None:
        start = await self.ctx.coord.revision()
        async for ev in self.ctx.coord.watch(keys.REGIONS, prefix=True, start_revision=start + 1):
            parsed = keys.region_of(ev.kv.key)
            if ev.type is not EventType.DELETE or parsed is None or parsed[1] != "alive":
                continue
            region = parsed[0]
            if region == self.region:
                continue
            if self.recovering and self._settling():
                log.info(
                    "failover_deferred",
                    region=region,
                    observer=self.region,
                    reason=(
                        "this term follows an earlier one of this controller (most likely "
                        "an etcd outage): the sweep decides once the region stays gone"
                    ),
                )
                continue  # the sweep fails it over if it stays gone (confirmed_dead)
            log.info("region_lease_expired", region=region, observer=self.region)
            try:
                await self.fail_over(region, detected_at_monotonic=time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the sweep retries it; keep watching
                log.warning("failover_retry_by_sweep", region=region, error=describe(exc))

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.config.reconcile_interval_s)
            if self._young():
                continue
            view = await read_view(self.ctx.coord)
            dead = {o.region for o in view.owners.values() if not view.is_alive(o.region)}
            for region in self.confirmed_dead(dead, time.monotonic()):
                await self.fail_over(region, detected_at_monotonic=time.monotonic(), quiet=True)

    def confirmed_dead(self, dead: set[str], now: float) -> list[str]:
        """Of the regions a sweep at `now` found dead, those to move now. In a term that
        follows an etcd outage, only those every sweep since at least a TTL and a second
        ago found dead too (a region seen alive starts over); otherwise all of them
        (their lease expired: an operator's resume after a pause moves them at once)."""
        self._dead_since = {r: self._dead_since.get(r, now) for r in dead - {self.region}}
        wait = self.ctx.config.lease_ttl_s + 1 if self.recovering else 0
        return sorted(r for r, since in self._dead_since.items() if now - since >= wait)

    def _young(self) -> bool:
        """Less than a TTL (and a second) into the term: no region can be judged dead
        from the liveness keys yet (a cold start, or one after an etcd outage)."""
        return time.monotonic() - self.term.began_at < self.ctx.config.lease_ttl_s + 1

    def _settling(self) -> bool:
        """Early enough in a term that follows an etcd outage for the outage's own lease
        expiries to still arrive: two TTLs and two seconds (the leases etcd's new leader
        extended last a TTL and an election timeout after it, and this term may have
        begun as soon as that leader did)."""
        ttl = self.ctx.config.lease_ttl_s
        return time.monotonic() - self.term.began_at < 2 * ttl + 2

    async def fail_over(
        self, region: str, *, detected_at_monotonic: float, quiet: bool = False
    ) -> int:
        """Race every dataset of a dead `region` to its successor; returns how many we won.

        `quiet` (the periodic sweep) logs nothing when there is nothing to move, so a
        dataset in manual mode is reported once per death, not once per second.
        """
        detected = utcnow()
        # Read together: the key's revision guards the move against a later apply.
        policy, policy_key = self.ctx.view.decided()
        if policy is None:
            if not quiet:
                log.warning("failover_skipped", region=region, reason="no policy is applied")
            return 0
        view = await read_view(self.ctx.coord)
        if view.maintenance:
            if not quiet:
                log.warning("failover_paused", region=region, reason="maintenance mode is on")
            return 0
        if view.is_alive(region):
            log.info("failover_skipped", region=region, reason="the region is alive again")
            return 0
        placements = await known_placements(self.ctx.coord, policy)
        plan = plan_moves(view, placements, dict(policy.regions), source=region, automatic=True)
        if quiet and not plan.moves:
            return 0
        exposures = (
            {}
            if self.ctx.holdings is None or not plan.moves
            else await prefer_holders(
                plan,
                {p.dataset: p for p in placements},
                view,
                dict(policy.regions),
                self.ctx.holdings,
            )
        )
        for r in plan.rejected:
            log.info(
                "failover_candidate_rejected",
                dataset=r.dataset,
                candidate=r.region,
                reason=r.reason,
            )
        for u in plan.unmoved:
            log.warning("failover_not_moved", dataset=u.dataset, region=region, reason=u.reason)
        for u in plan.retired:
            log.info("failover_retired_owner", dataset=u.dataset, region=region, reason=u.reason)
        owners = Ownership(self.ctx.coord)
        results = await asyncio.gather(
            *(
                self.ctx.moves.run(
                    apply_move(
                        owners,
                        m,
                        guards=automatic_guards(m, view, policy_key),
                        kind="automatic",
                        reason="lease expired",
                        actor=self.ctx.actor,
                        journal=self.ctx.records,
                        probe=self.ctx.records,
                        detected_at=detected,
                        started_at=detected,
                        exposure=exposures.get(m.dataset),
                    )
                )
                for m in plan.moves
            ),
            return_exceptions=True,
        )
        won = 0
        for m, outcome in zip(plan.moves, results, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("failover_move_failed", dataset=m.dataset, error=describe(outcome))
            elif outcome is not None:
                won += 1
        self.ctx.metrics.failovers.inc(won)
        if plan.moves:
            self.ctx.metrics.failover_seconds.observe(time.monotonic() - detected_at_monotonic)
        log.info(
            "failover_done",
            region=region,
            moves=len(plan.moves),
            won=won,
            policy_revision=policy.revision,
        )
        return won
