"""`ResidencySweeper`: at each new policy revision, the read cache drops the entries of
datasets this region may no longer hold (`ReadCache.drop_outside_residency`). Without
it a narrowed residency dropped an entry only at its next read, and a dataset no
policy governs any more (never read through the cache again) kept its copies until
they were evicted."""

from __future__ import annotations

import asyncio
import contextlib

from agents.cache.cache import ReadCache
from controlplane.errors import OperationTimeoutError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy, PolicyView

log = get_logger("meridian.agent.cache")

IDLE_WAIT_S = 3600.0  # a wait for a new revision is renewed after this long


class ResidencySweeper(Lifecycle):
    def __init__(self, cache: ReadCache, view: PolicyView) -> None:
        self._cache = cache
        self._view = view
        self._task: asyncio.Task[None] | None = None
        self.sweeps = 0  # sweeps ended (tests wait on it)

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(self._view.current), name="cache-residency")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self, seen: CompiledPolicy | None) -> None:
        while True:

            def moved(p: CompiledPolicy | None, seen: CompiledPolicy | None = seen) -> bool:
                return p is not seen

            with contextlib.suppress(OperationTimeoutError):
                await self._view.wait_for(moved, IDLE_WAIT_S)
            if self._view.current is seen:
                continue
            seen = self._view.current
            try:
                await self._cache.drop_outside_residency()
            except Exception as exc:  # noqa: BLE001 - the next revision sweeps again
                log.warning("cache_residency_sweep_failed", error=str(exc))
            self.sweeps += 1
