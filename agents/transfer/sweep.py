"""The periodic expiry of resume states (resume.py): a cut transfer that is never
retried must not keep its partial bytes for ever. The book is swept at start (by
TransferService) and then every `interval_s`, each pass removing at most
`max_per_pass` expired states on a worker thread, so that a folder full of them
costs a bounded amount of work per pass and never stalls the event loop. States of
pulls in flight are spared (ResumeBook.in_flight)."""

from __future__ import annotations

import asyncio

from agents.periodic import Periodic
from agents.transfer.resume import MAX_AGE_S, ResumeBook
from controlplane.logs import get_logger

log = get_logger(__name__)

SWEEP_INTERVAL_S = 3600.0
MAX_PER_PASS = 1000


class ResumeSweeper(Periodic):
    task_name = "meridian-resume-sweep"

    def __init__(
        self,
        book: ResumeBook,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        max_age_s: float = MAX_AGE_S,
        max_per_pass: int = MAX_PER_PASS,
    ) -> None:
        super().__init__(interval_s)
        self.book = book
        self.max_age_s = max_age_s
        self.max_per_pass = max_per_pass

    async def sweep_once(self) -> int:
        """One bounded pass; returns how many states it removed."""
        removed = await asyncio.to_thread(
            self.book.expire, max_age_s=self.max_age_s, limit=self.max_per_pass
        )
        if removed:
            log.info("resume states expired", removed=removed, folder=str(self.book.folder))
        return removed

    async def _pass(self) -> None:
        await self.sweep_once()
