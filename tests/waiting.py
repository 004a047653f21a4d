"""Bounded waits for tests: the one place a test polls a condition.

    owner = await until(lambda: owner_of(coord, ds), 30, what=f"an owner of {ds}")
    until_sync(lambda: path.exists(), 10, what=f"{path} to be written")

`predicate` is called (and awaited, when it returns an awaitable) every `step_s`
until it returns something truthy, which is returned; after `timeout_s` (and at
most `timeout_s / step_s + 2` calls, so the loop is bounded in count as well as in
time) `WaitTimeoutError` names what was awaited and the last value seen (or what
`detail()` says then, where the falsy value tells nothing). An exception
the predicate raises is not swallowed: a predicate that asserts on intermediate
states fails the test at once, as a hand-written loop did.

Poll only what cannot be awaited directly: where the code under test offers an
event, a watch or a future, await that (with `asyncio.timeout`) instead.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A bounded wait ran out; an AssertionError so that it fails the test as one."""


def _rounds(timeout_s: float, step_s: float) -> int:
    if timeout_s < 0 or step_s <= 0:
        raise ValueError(f"a wait needs timeout_s >= 0 and step_s > 0, not {timeout_s}, {step_s}")
    return int(timeout_s / step_s) + 2


def _timed_out(
    what: str, timeout_s: float, last: object, detail: Callable[[], object] | None
) -> WaitTimeoutError:
    seen = detail() if detail is not None else last
    return WaitTimeoutError(f"waited {timeout_s} s for {what}; last seen: {seen!r}")


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float,
    what: str,
    *,
    step_s: float = 0.05,
    detail: Callable[[], object] | None = None,
) -> T:
    """The first truthy value of `predicate()` within `timeout_s` (see the module doc)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    for _ in range(_rounds(timeout_s, step_s)):
        got = predicate()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        last = got
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(step_s)
    raise _timed_out(what, timeout_s, last, detail)


def until_sync(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    step_s: float = 0.05,
    detail: Callable[[], object] | None = None,
) -> T:
    """`until` for code that runs outside an event loop (process harnesses)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    for _ in range(_rounds(timeout_s, step_s)):
        got = predicate()
        if got:
            return got
        last = got
        if time.monotonic() >= deadline:
            break
        time.sleep(step_s)
    raise _timed_out(what, timeout_s, last, detail)
