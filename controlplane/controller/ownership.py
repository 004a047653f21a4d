"""Ownership tracking: which critical datasets this region owns, and the fence canary.

For one term. The `owners` loop reads every owner and then watches
`/meridian/owners/` from that read's revision (after an error it reads again, so
nothing is missed). With a fence directory, the `fence` loop keeps the
`FencedResource` in step with etcd (epochs and handover freezes, as an agent's
would be) and the `canary` loop writes through it for each owned dataset: a
controller that was paused past its lease and wakes up is refused there, and
drops the dataset.
"""

from __future__ import annotations

import asyncio

from controlplane.controller.config import ControllerContext
from controlplane.controller.duty import Duty, Loop
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, StaleEpochError
from controlplane.coordination.protocols.follow import follow_ownership
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.protocols.view import read_view
from controlplane.logs import get_logger

log = get_logger("meridian.controller")


class OwnershipTracker(Duty):
    name = "ownership"

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx.config.region, **ctx.retry())
        self.ctx = ctx
        self.ownership = Ownership(ctx.coord)
        self.owned: dict[str, int] = {}

    def loops(self) -> dict[str, Loop]:
        loops: dict[str, Loop] = {"owners": self._owners}
        if self.ctx.fence is not None:
            loops["fence"] = self._follow_fence
            loops["canary"] = self._canary
        return loops

    def gain(self, dataset: str, epoch: int) -> None:
        if self.owned.get(dataset, 0) < epoch:
            self.owned[dataset] = epoch
            if self.ctx.fence is not None:
                self.ctx.fence.observe(dataset, epoch)
            self.ctx.metrics.owned.set(len(self.owned))

    def _lose(self, dataset: str) -> None:
        self.owned.pop(dataset, None)
        self.ctx.metrics.owned.set(len(self.owned))

    async def _owners(self) -> None:
        me = self.region
        view = await read_view(self.ctx.coord)
        mine = {d: o.epoch for d, o in view.owners.items() if o.region == me}
        for dataset in set(self.owned) - set(mine):
            self._lose(dataset)
        for dataset, epoch in mine.items():
            self.gain(dataset, epoch)
        log.info("ownership_read", region=me, owns=len(self.owned), revision=view.revision)
        async for dataset, owner in self.ownership.watch(view.revision + 1):
            if owner is not None and owner.region == me:
                self.gain(dataset, owner.epoch)
            elif dataset in self.owned:
                self._lose(dataset)
                log.info(
                    "ownership_lost",
                    dataset=dataset,
                    region=me,
                    to=owner.region if owner else None,
                    epoch=owner.epoch if owner else None,
                )

    async def _follow_fence(self) -> None:
        if self.ctx.fence is not None:
            await follow_ownership(self.ctx.coord, self.ctx.fence)

    async def _canary(self) -> None:
        fence = self.ctx.fence
        if fence is None:
            return
        seq = 0
        while True:
            await asyncio.sleep(self.ctx.config.canary_interval_s)
            seq += 1
            for dataset, epoch in list(self.owned.items()):
                try:
                    await asyncio.to_thread(
                        fence.write,
                        dataset,
                        epoch,
                        {"seq": seq, "region": self.region},
                        self.ctx.config.controller_id,
                    )
                except DatasetHandingOverError:
                    continue
                except StaleEpochError as exc:
                    self.ctx.metrics.fenced.inc()
                    self._lose(dataset)
                    log.warning(
                        "fenced",
                        dataset=dataset,
                        region=self.region,
                        epoch=epoch,
                        error=str(exc),
                        action="stepping down from this dataset",
                    )
