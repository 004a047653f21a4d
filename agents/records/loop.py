"""The one loop both record duties run: take a bounded batch, ship it, repeat.

A `BatchDuty` is a `Lifecycle` owning one task. `step()` ships at most one batch
and says how many items it handled; when it handled none (or fewer than a
batch) the loop waits `idle_interval_s`, or less when `notify()` (callable from
any thread, e.g. right after a store commit) wakes it. A failed step never ends
the loop: the error is logged as one structured event and the step is retried
after a backoff (retriable errors from `retry_initial_s`, doubling to
`retry_max_s`; anything else at the ceiling, so a bug cannot become a busy loop).
The data path never waits for any of this: it only commits to the store.

`stop()` lets the step in flight finish for up to `stop_timeout_s`, then cancels
it; whatever it had not marked done is shipped again after restart, which every
record tolerates (catalog writes and change events are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib

from controlplane.controller.duty import Backoff, describe, is_retriable
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger

log = get_logger("meridian.agent.records")


class BatchDuty(Lifecycle):
    name = "batch"

    def __init__(
        self,
        region: str,
        *,
        batch_size: int,
        idle_interval_s: float,
        retry_initial_s: float,
        retry_max_s: float,
        stop_timeout_s: float,
    ) -> None:
        self.region = region
        self.batch_size = batch_size
        self._idle_s = idle_interval_s
        self._backoff = Backoff(retry_initial_s, retry_max_s)
        self._stop_timeout_s = stop_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._halt: asyncio.Event | None = None
        self._stopping = False
        self.failing: str | None = None  # the last step's error while failing, else None

    async def step(self) -> int:
        """Ship at most one batch; return how many items it handled (0: nothing to do)."""
        raise NotImplementedError

    def notify(self) -> None:
        """Wake the loop now (thread-safe; a no-op before start or after stop)."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(wake.set)

    async def _do_start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._halt = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-{self.region}")

    async def _do_stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        for event in (self._wake, self._halt):
            if event is not None:
                event.set()
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self._stop_timeout_s)
        except TimeoutError:
            log.warning("records_stop_timeout", duty=self.name, region=self.region)
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while not self._stopping:
            try:
                done = await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed batch is retried, never fatal
                retriable = is_retriable(exc)
                delay = self._backoff.next(retriable=retriable)
                if self.failing is None:
                    log_fn = log.warning if retriable else log.error
                else:
                    log_fn = log.info  # still failing: quieter than the first report
                self.failing = describe(exc)
                log_fn(
                    "records_retry",
                    duty=self.name,
                    region=self.region,
                    error=self.failing,
                    retriable=retriable,
                    retry_in_s=round(delay, 3),
                )
                # Only stop() shortens a backoff: writes notifying during an outage
                # must not turn the retries into a busy loop.
                await self._pause(delay, self._halt)
                continue
            if self.failing is not None:
                log.info("records_recovered", duty=self.name, region=self.region)
                self.failing = None
            self._backoff.reset()
            if done < self.batch_size:
                await self._pause(self._idle_s, self._wake)

    async def _pause(self, delay_s: float, event: asyncio.Event | None) -> None:
        if event is None or self._stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), delay_s)
        if not self._stopping:
            event.clear()
