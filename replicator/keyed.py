"""Bounded concurrency across keys, strict order within a key.

Each object's events must apply in log order (a delete after its put), while
events of different objects may run at once. `KeyedRunner.submit(key, job)` waits
for a free slot (at most `limit` jobs exist at a time, queued or running, which
bounds memory and pushes back on the poll loop), then starts `job` after the
previous job of the same key has finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from controlplane.lifecycle import cancel_and_wait


class KeyedRunner:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._slots = asyncio.Semaphore(limit)
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def active(self) -> int:
        return len(self._tasks)

    async def submit(self, key: str, job: Callable[[], Awaitable[None]]) -> None:
        await self.submit_many((key,), job)

    async def submit_many(self, keys: Iterable[str], job: Callable[[], Awaitable[None]]) -> None:
        """One job for several keys (a batch): it starts once the previous job of every
        one of them has finished, and a later job of any of them waits for it. It takes
        one slot."""
        names = list(dict.fromkeys(keys))
        await self._slots.acquire()
        previous = {self._tails[k] for k in names if k in self._tails}
        task = asyncio.create_task(self._after(previous, job), name=f"apply:{names[0]}")
        for k in names:
            self._tails[k] = task
        self._tasks.add(task)

        def finished(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            for k in names:
                if self._tails.get(k) is t:
                    del self._tails[k]
            self._slots.release()

        task.add_done_callback(finished)

    @staticmethod
    async def _after(previous: set[asyncio.Task[None]], job: Callable[[], Awaitable[None]]) -> None:
        if previous:
            # Order only: the previous jobs' failures are their own (and already logged).
            await asyncio.wait(previous)
            if any(p.cancelled() for p in previous):
                raise asyncio.CancelledError
        await job()

    async def drain(self) -> None:
        """Wait for every job submitted so far."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        await cancel_and_wait(*self._tasks)
