"""Bounded concurrency across keys, strict order within a key.

Each object's events must apply in log order (a delete after its put), while
events of different objects may run at once. `KeyedRunner.submit(key, job)` waits
for a free slot (at most `limit` jobs exist at a time, queued or running, which
bounds memory and pushes back on the poll loop), then starts `job` after the
previous job of the same key has finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

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
        await self._slots.acquire()
        previous = self._tails.get(key)
        task = asyncio.create_task(self._after(previous, job), name=f"apply:{key}")
        self._tails[key] = task
        self._tasks.add(task)

        def finished(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._tails.get(key) is t:
                del self._tails[key]
            self._slots.release()

        task.add_done_callback(finished)

    @staticmethod
    async def _after(
        previous: asyncio.Task[None] | None, job: Callable[[], Awaitable[None]]
    ) -> None:
        if previous is not None:
            # Order only: the previous job's failure is its own (and already logged).
            await asyncio.wait([previous])
            if previous.cancelled():
                raise asyncio.CancelledError
        await job()

    async def drain(self) -> None:
        """Wait for every job submitted so far."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        await cancel_and_wait(*self._tasks)
