"""`run_to_the_end` (agents/to_the_end.py): a cancelled caller waits for its thread to
end, `on_cancel` runs once, and an uncancelled caller gets the thread's result or
error."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agents.to_the_end import open_in_thread, run_to_the_end

WAIT_S = 10.0


async def test_a_cancelled_caller_waits_for_its_thread_then_is_cancelled() -> None:
    entered, release, ended = threading.Event(), threading.Event(), threading.Event()
    told: list[str] = []

    def work() -> str:
        entered.set()
        release.wait(WAIT_S)
        ended.set()
        return "done"

    call = asyncio.create_task(run_to_the_end(work, on_cancel=lambda: told.append("cancel")))
    await asyncio.to_thread(entered.wait, WAIT_S)
    call.cancel()
    await asyncio.sleep(0.05)  # the window: the caller must still wait
    call.cancel()  # a second cancellation is held too, and not told twice
    await asyncio.sleep(0.05)
    assert not call.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, WAIT_S)
    assert ended.is_set()
    assert told == ["cancel"]


async def test_an_uncancelled_caller_gets_the_result_or_the_error() -> None:
    assert await run_to_the_end(lambda: 42) == 42

    def fails() -> None:
        raise ValueError("the thread's own error")

    with pytest.raises(ValueError, match="the thread's own error"):
        await run_to_the_end(fails)


class Opened:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def test_what_a_thread_opened_for_a_cancelled_caller_is_closed() -> None:
    entered, release = threading.Event(), threading.Event()
    opened = Opened()

    def open_() -> Opened:
        entered.set()
        release.wait(WAIT_S)  # as a store's open waits for a group commit's fsync
        return opened

    call = asyncio.create_task(open_in_thread(open_))
    await asyncio.to_thread(entered.wait, WAIT_S)
    call.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, WAIT_S)
    assert opened.closed == 1


async def test_a_caller_not_cancelled_gets_what_was_opened_open() -> None:
    opened = Opened()
    assert await open_in_thread(lambda: opened) is opened
    assert opened.closed == 0


async def test_release_is_not_called_when_the_thread_failed() -> None:
    entered, release = threading.Event(), threading.Event()
    released: list[object] = []

    def fail() -> object:
        entered.set()
        release.wait(WAIT_S)
        raise OSError("no such file")

    call = asyncio.create_task(run_to_the_end(fail, release=released.append))
    await asyncio.to_thread(entered.wait, WAIT_S)
    call.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, WAIT_S)
    assert released == []
