"""A pass run every `interval_s` beside an agent's work (the resume sweep, the
tombstone expiry): the first one `interval_s` after start, so a restart loop costs no
passes; a pass that fails is logged and the next one tries again; `passes` counts
those that ended, and `wait_passes` lets a test wait for them instead of sleeping."""

from __future__ import annotations

import asyncio

from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger

log = get_logger(__name__)


class Periodic(Lifecycle):
    """Subclasses give `_pass` and a task name."""

    task_name = "meridian-periodic"

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"{self.task_name}: the interval must be > 0 s, got {interval_s:g}")
        self.interval_s = interval_s
        self.passes = 0  # passes ended, failed or not (tests and logs)
        self._task: asyncio.Task[None] | None = None
        self._pass_done = asyncio.Condition()

    async def _pass(self) -> None:
        raise NotImplementedError

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def wait_passes(self, count: int) -> None:
        """Until `count` passes have ended (for tests: no sleeping)."""
        async with self._pass_done:
            await self._pass_done.wait_for(lambda: self.passes >= count)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._pass()
            except Exception as err:  # noqa: BLE001 - whatever failed, the next pass tries again
                log.warning("periodic_pass_failed", task=self.task_name, error=f"{err!r}")
            async with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
