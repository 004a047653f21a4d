"""Work in a thread that a cancelled caller still waits for.

`asyncio.to_thread` returns at once when its caller is cancelled (a call's deadline,
the server stopping), but the thread cannot be stopped and runs on. What the caller
holds around the work then ends before the work does: a replica's registration that a
new owner's listing waits on (`Admission.receiving`) would end while the copy is still
committing, so the listing could miss a copy that lands a moment later; a staged file
would be removed under the commit that renames it. `run_to_the_end` keeps the caller
until the thread has ended, then lets the cancellation through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


async def run_to_the_end(
    work: Callable[[], T],
    *,
    on_cancel: Callable[[], object] | None = None,
    release: Callable[[T], object] | None = None,
) -> T:
    """`work()` in a thread; a cancellation is held until it has ended, then raised.
    `on_cancel` runs once, at the first cancellation (to tell the thread, say, to store
    nothing if it has not begun). `release` gets what the thread returned when the
    caller was cancelled meanwhile: what it opened for a caller that is gone."""
    thread = asyncio.ensure_future(asyncio.to_thread(work))
    cancelled = False
    while not thread.done():
        try:
            await asyncio.wait([thread])
        except asyncio.CancelledError:
            if not cancelled and on_cancel is not None:
                on_cancel()
            cancelled = True
    if cancelled:
        # Retrieved either way: the caller is gone, the outcome was the thread's.
        if not thread.cancelled() and thread.exception() is None and release is not None:
            release(thread.result())
        raise asyncio.CancelledError
    return thread.result()


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


async def open_in_thread(open_: Callable[[], C]) -> C:
    """`open_()` (an object's reader, say) in a thread, for a caller that closes what it
    gets: one cancelled meanwhile (a call's deadline, under a group commit holding the
    store's lock) closes it once the thread has it. `asyncio.to_thread` would leave it
    open: a descriptor, and a pruned version's disk space, held until restart."""
    return await run_to_the_end(open_, release=lambda opened: opened.close())
