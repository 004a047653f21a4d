"""The shared lifecycle: start once, stop idempotent, stop after a failed start."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle


class Recorder(Lifecycle):
    def __init__(self, fail_start: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_start = fail_start

    async def _do_start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise RuntimeError("boom")

    async def _do_stop(self) -> None:
        self.calls.append("stop")


async def test_start_twice_is_refused_and_stop_is_idempotent() -> None:
    component = Recorder()
    async with component:
        assert component.running
        with pytest.raises(MeridianError, match="already started"):
            await component.start()
    await component.stop()
    assert component.calls == ["start", "stop"]
    assert not component.running


async def test_a_failed_start_still_stops() -> None:
    component = Recorder(fail_start=True)
    with pytest.raises(RuntimeError):
        await component.start()
    assert component.calls == ["start", "stop"]


async def test_stop_before_start_does_nothing() -> None:
    component = Recorder()
    await component.stop()
    assert component.calls == []


async def test_cancel_and_wait_does_not_swallow_a_cancel_of_the_waiter() -> None:
    """A child that takes long to finish its cancellation: the stopper waits for it, and
    a cancel aimed at the stopper itself (a second SIGTERM, a timeout) still lands."""
    from controlplane.lifecycle import cancel_and_wait

    release = asyncio.Event()
    cleaned: list[str] = []

    async def child() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # slow clean-up
            cleaned.append("child")

    task = asyncio.create_task(child())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0)
    stopper.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
    plain = asyncio.create_task(child())
    await asyncio.sleep(0)
    await cancel_and_wait(plain)  # the child's own cancellation is swallowed
    assert plain.cancelled() and cleaned == ["child", "child"]
