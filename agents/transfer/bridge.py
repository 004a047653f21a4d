"""Between the event loop and the threads that do the heavy work (the delta engine,
hashing, disk writes): a blocking iterator run on a thread, read as an async
iterator; and an async producer feeding a blocking iterator on a thread. Both are
bounded (a few chunks in flight), so a slow side holds the other back instead of
buffering a whole file in memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()
DEPTH = 4


class PipeAbandonedError(Exception):
    """The async side of a ChunkPipe went away without ending it."""


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def iterate_in_thread(
    make: Callable[[], Iterator[T]], depth: int = DEPTH
) -> AsyncIterator[T]:
    """Items of the iterator `make()` returns, produced on a thread of its own. Leaving
    the `async for` early (or being cancelled) closes the iterator on its thread (the
    delta engine cancels itself there) and waits for that thread."""
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[object] = asyncio.Queue()
    slots = threading.Semaphore(depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not slots.acquire(timeout=0.2):
            if stop.is_set():
                return False
        if stop.is_set():
            return False
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is reading
            return False
        return True

    def work() -> None:
        try:
            iterator = make()
            try:
                for item in iterator:
                    if not put(item):
                        return
            finally:
                close = getattr(iterator, "close", None)
                if callable(close):
                    close()
            put(_END)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the loop below
            put(_Failure(exc))

    thread = threading.Thread(target=work, name="meridian-xfer-produce", daemon=True)
    thread.start()
    try:
        while True:
            item = await items.get()
            slots.release()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)


class ChunkPipe(Generic[T]):
    """Items put on the event loop, consumed as a blocking iterator on a thread (the
    patch engine's delta source, a writer). `close()` ends the iteration after the
    items already put; `fail(exc)` makes the consumer raise `exc` instead; `abandon()`
    (callable from anywhere, e.g. a `finally` of a cancelled task) fails it with
    `PipeAbandonedError`. At most `depth` items wait at once (a semaphore on the loop side);
    the queue itself is a thread-safe `queue.Queue` the consumer blocks on."""

    def __init__(self, depth: int = DEPTH) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._slots = asyncio.Semaphore(depth)
        self._gone = threading.Event()  # the consumer stopped reading

    async def put(self, item: T, consumer: asyncio.Future[object]) -> bool:
        """Put one item; False (and the item dropped) if the consumer ended first."""
        if consumer.done() or self._gone.is_set():
            return False
        if not self._slots.locked():  # a free slot: no need to watch the consumer
            await self._slots.acquire()
            self._queue.put(item)
            return True
        slot: asyncio.Future[object] = asyncio.ensure_future(self._slots.acquire())
        done, _ = await asyncio.wait({slot, consumer}, return_when=asyncio.FIRST_COMPLETED)
        if slot not in done:
            slot.cancel()
            return False
        self._queue.put(item)
        return True

    def close(self) -> None:
        self._queue.put(_END)

    def fail(self, exc: BaseException) -> None:
        self._queue.put(_Failure(exc))

    def abandon(self) -> None:
        self._queue.put(_Failure(PipeAbandonedError("the stream feeding this transfer stopped")))

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                item = self._queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                    self._loop.call_soon_threadsafe(self._slots.release)
                yield item  # type: ignore[misc]
        finally:
            self._gone.set()


def _read_chunks(path: str, size: int) -> Iterator[bytes]:
    with open(path, "rb") as source:
        while chunk := source.read(size):
            yield chunk


def file_chunks(path: str, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """The bytes of a file in chunks, read on a thread."""
    return iterate_in_thread(lambda: _read_chunks(path, size))


async def remove(path: str) -> None:
    """Remove a file if it is there, on a thread."""
    await asyncio.to_thread(_unlink, path)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
