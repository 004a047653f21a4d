"""One lifecycle for every long-lived async component (STYLE.md item 3).

`start()` refuses to run twice, `stop()` is idempotent and also runs when start
fails half-way, and `async with` works. Subclasses implement `_do_start` and
`_do_stop`, owning (creating, cancelling and awaiting) their own tasks.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any, Self

from controlplane.errors import MeridianError


class Lifecycle:
    _started = False
    _stopped = False

    async def _do_start(self) -> None:
        raise NotImplementedError

    async def _do_stop(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    async def start(self) -> None:
        if self._started:
            raise MeridianError(f"{type(self).__name__} was already started; make a new one")
        self._started = True
        try:
            await self._do_start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._started and not self._stopped:
            self._stopped = True
            await self._do_stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.stop()


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel `tasks` and wait for each to finish, swallowing their cancellation only.

    `contextlib.suppress(CancelledError)` around the await would also swallow a cancel
    aimed at the task doing the stop (a second SIGTERM, a timeout around `stop()`), so
    that it could not be interrupted; here such a cancel is raised again."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
