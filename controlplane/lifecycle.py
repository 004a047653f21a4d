"""One lifecycle for every long-lived async component (STYLE.md item 3).

`start()` refuses to run twice, `stop()` is idempotent and also runs when start
fails half-way, and `async with` works. Subclasses implement `_do_start` and
`_do_stop`, owning (creating, cancelling and awaiting) their own tasks.
"""

from __future__ import annotations

import types
from typing import Self

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
