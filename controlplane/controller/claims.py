"""Claims: the home region takes every critical dataset homed in it that has no owner.

For one term: on start, on every new applied policy and every
`reconcile_interval_s`. Which datasets are homed here comes from the policy in
etcd (`PolicyView`) and the datasets announced there after the apply
(`protocols.datasets`), never from the catalog; with no policy applied nothing is
claimed. Each claim is guarded by this term's liveness key and the region's
state, so a claim made on a stale view fails instead of doing harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import operator

from controlplane.controller.config import ControllerContext, Term
from controlplane.controller.duty import Duty, Loop
from controlplane.controller.ownership import OwnershipTracker
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.datasets import known_placements
from controlplane.coordination.protocols.view import RegionState, read_view
from controlplane.errors import ConflictError, OperationTimeoutError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Cmp, Compare, Target

log = get_logger("meridian.controller")

CONCURRENT_CLAIMS = 32


class Claims(Duty):
    name = "claims"

    def __init__(self, ctx: ControllerContext, term: Term, tracker: OwnershipTracker) -> None:
        super().__init__(ctx.config.region, **ctx.retry())
        self.ctx = ctx
        self.term = term
        self.tracker = tracker

    def loops(self) -> dict[str, Loop]:
        return {"claim": self._loop}

    async def _loop(self) -> None:
        while True:
            seen = self.ctx.view.current
            await self.claim_unowned(seen)
            # Wake early when a new policy is applied (it may home new datasets here).
            with contextlib.suppress(OperationTimeoutError):
                await self.ctx.view.wait_for(
                    functools.partial(operator.is_not, seen), self.ctx.config.reconcile_interval_s
                )

    async def claim_unowned(self, policy: CompiledPolicy | None) -> int:
        """Claim what is homed here and unowned; how many were won."""
        if policy is None:
            return 0
        me = self.region
        view = await read_view(self.ctx.coord)
        if view.state_of(me) is not RegionState.ACTIVE:
            return 0
        placements = await known_placements(self.ctx.coord, policy)
        todo = [
            p.dataset
            for p in placements
            if p.dataset_class == "critical" and p.home == me and p.dataset not in view.owners
        ]
        guards = [
            *term_guards(me, self.term),
            Compare(keys.state(me), Target.MOD, Cmp.EQUAL, view.state_revisions.get(me, 0)),
        ]
        # Independent transactions, run concurrently (bounded): a WAN round trip is
        # paid once per batch, not once per dataset.
        limit = asyncio.Semaphore(CONCURRENT_CLAIMS)
        won = 0

        async def claim(dataset: str) -> None:
            nonlocal won
            async with limit:
                try:
                    epoch = await self.tracker.ownership.claim(
                        dataset,
                        me,
                        expect_epoch=0,
                        reason="home region claims an unowned dataset",
                        actor=self.ctx.actor,
                        guards=guards,
                    )
                except ConflictError:
                    log.info("claim_lost", dataset=dataset, region=me)
                    return
            won += 1
            self.ctx.metrics.claims.inc()
            self.tracker.gain(dataset, epoch)
            log.info("claimed", dataset=dataset, region=me, epoch=epoch)

        async with asyncio.TaskGroup() as tg:
            for dataset in todo:
                tg.create_task(claim(dataset))
        return won


def term_guards(region: str, term: Term) -> list[Compare]:
    """Compares that hold only while `term` is the region's term: its liveness key is
    the one this term wrote (not made anew after a death, nor overwritten by a standby
    that took over, which keeps its create revision)."""
    alive = keys.alive(region)
    return [
        Compare(alive, Target.CREATE, Cmp.EQUAL, term.alive_create_revision),
        Compare(alive, Target.MOD, Cmp.EQUAL, term.revision),
    ]
