"""The shape of every controller duty: named loops that log, back off and retry.

A duty (claims, ownership tracking, failover watch, journal) is a `Lifecycle`
component that owns a few loops. A loop that raises is never the end of the
process: the error is logged as one structured event and the loop starts again
after a backoff. `error.retriable` decides how long: a retriable error (etcd or
the catalog unreachable, a lost race) is retried quickly, doubling up to the
duty's ceiling; anything else (a non-retriable Meridian error, or an exception
from a library that was not translated) is logged at error level and retried at
the ceiling, so a bug cannot turn into a busy loop. Only the election ends a
term, and only when the lease is lost; see `election.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger

log = get_logger("meridian.controller")

Loop = Callable[[], Awaitable[None]]


class Backoff:
    """Delays that double from `initial_s` to `max_s`; `reset()` after a success."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max(max_s, initial_s)
        self._next = initial_s

    def next(self, *, retriable: bool = True) -> float:
        if not retriable:
            return self.max_s
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.initial_s


def is_retriable(exc: BaseException) -> bool:
    """`error.retriable` for Meridian errors (for a group: of every error in it);
    False for anything untranslated."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_retriable(e) for e in exc.exceptions)
    return isinstance(exc, MeridianError) and exc.retriable


def describe(exc: BaseException) -> str:
    """One line: the type and first line of the error (of a group: its first error)."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return describe(exc.exceptions[0])
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Duty(Lifecycle):
    """Subclasses name themselves and list their loops; the rest is shared."""

    name = "duty"

    def __init__(self, region: str, *, retry_initial_s: float, retry_max_s: float) -> None:
        self.region = region
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._tasks: list[asyncio.Task[None]] = []

    def loops(self) -> dict[str, Loop]:
        raise NotImplementedError

    async def _do_start(self) -> None:
        for what, body in self.loops().items():
            task = asyncio.create_task(self._keep_running(what, body), name=f"{self.name}-{what}")
            self._tasks.append(task)

    async def _do_stop(self) -> None:
        tasks, self._tasks = list(self._tasks), []
        await cancel_and_wait(*tasks)

    async def _keep_running(self, what: str, body: Loop) -> None:
        backoff = Backoff(self._retry_initial_s, self._retry_max_s)
        while True:
            began = time.monotonic()
            try:
                await body()
                delay = backoff.initial_s  # a loop that ended (a watch closed): go again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a duty's error never ends the process
                if time.monotonic() - began > backoff.max_s:
                    backoff.reset()  # it ran well for a while: this is a new outage
                retriable = is_retriable(exc)
                delay = backoff.next(retriable=retriable)
                (log.warning if retriable else log.error)(
                    "duty_retry",
                    duty=self.name,
                    loop=what,
                    region=self.region,
                    error=describe(exc),
                    retriable=retriable,
                    retry_in_s=round(delay, 3),
                )
            await asyncio.sleep(delay)
