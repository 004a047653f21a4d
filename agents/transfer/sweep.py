"""The periodic expiry of resume states (resume.py): a cut transfer that is never
retried must not keep its partial bytes for ever. The book is swept at start (by
TransferService) and then every `interval_s`, each pass removing at most
`max_per_pass` expired states on a worker thread, so that a folder full of them
costs a bounded amount of work per pass and never stalls the event loop. States of
pulls in flight are spared (ResumeBook.in_flight)."""

from __future__ import annotations

import asyncio

from agents.transfer.resume import MAX_AGE_S, ResumeBook
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger

log = get_logger(__name__)

SWEEP_INTERVAL_S = 3600.0
MAX_PER_PASS = 1000


class ResumeSweeper(Lifecycle):
    def __init__(
        self,
        book: ResumeBook,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        max_age_s: float = MAX_AGE_S,
        max_per_pass: int = MAX_PER_PASS,
    ) -> None:
        self.book = book
        self.interval_s = interval_s
        self.max_age_s = max_age_s
        self.max_per_pass = max_per_pass
        self.passes = 0  # passes completed (tests and logs)
        self._task: asyncio.Task[None] | None = None
        self._pass_done = asyncio.Condition()

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="meridian-resume-sweep")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def sweep_once(self) -> int:
        """One bounded pass; returns how many states it removed."""
        removed = await asyncio.to_thread(
            self.book.expire, max_age_s=self.max_age_s, limit=self.max_per_pass
        )
        if removed:
            log.info("resume states expired", removed=removed, folder=str(self.book.folder))
        return removed

    async def wait_passes(self, count: int) -> None:
        """Until `count` passes have completed (for tests: no sleeping)."""
        async with self._pass_done:
            await self._pass_done.wait_for(lambda: self.passes >= count)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sweep_once()
            except OSError as err:  # the next pass tries again
                log.warning("resume sweep failed", folder=str(self.book.folder), error=str(err))
            async with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
