"""The bounded wait every test polls with (tests/waiting.py)."""

from __future__ import annotations

import time

import pytest
from waiting import WaitTimeoutError, until, until_sync


async def test_until_returns_the_first_truthy_value_of_a_sync_or_async_predicate() -> None:
    calls: list[int] = []

    def sync() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    async def coro() -> str:
        return "ready"

    assert await until(sync, 5, what="three calls", step_s=0.001) == 3
    assert await until(coro, 5, what="an async answer") == "ready"


async def test_until_names_what_it_waited_for_and_is_bounded_in_count() -> None:
    calls: list[int] = []

    def never() -> bool:
        calls.append(1)
        return False

    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=r"waited 0.2 s for the moon; last seen: False"):
        await until(never, 0.2, what="the moon", step_s=0.05)
    assert time.monotonic() - started < 5
    assert 1 <= len(calls) <= 0.2 / 0.05 + 2
    with pytest.raises(WaitTimeoutError, match=r"last seen: 'details'"):
        await until(lambda: None, 0, what="x", detail=lambda: "details")


async def test_until_lets_the_predicates_own_failure_through() -> None:
    def broken() -> bool:
        raise AssertionError("an intermediate state was wrong")

    with pytest.raises(AssertionError, match="intermediate state"):
        await until(broken, 5, what="anything")


def test_until_sync_waits_and_times_out_alike() -> None:
    start = time.monotonic()
    assert until_sync(lambda: time.monotonic() - start > 0.05, 5, what="a tick", step_s=0.01)
    with pytest.raises(WaitTimeoutError, match="for nothing"):
        until_sync(lambda: 0, 0.05, what="nothing", step_s=0.01)
    with pytest.raises(ValueError, match="step_s > 0"):
        until_sync(lambda: 1, 1, what="a bad step", step_s=0)
