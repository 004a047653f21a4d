"""`run_to_the_end` (agents/to_the_end.py): a cancelled caller waits for its thread to
end, `on_cancel` runs once, and an uncancelled caller gets the thread's result or
error."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agents.to_the_end import run_to_the_end

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
