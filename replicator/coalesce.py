"""Batch calls to the agent that merge while they wait for a free call.

The applier sends each run's inline events to the agent in one `apply_many` call, at
most `max_calls` at once (the agent's store commits one transaction at a time). Under
a steady trickle every poll is a small run, and each small run used to wait for a
call of its own: with 64 runs queued behind 2 calls of ~80 ms each, an event waited
~2.5 s (the standing queue of issue 12's lag row). Here the runs that wait are
merged, up to `max_events` events and `max_bytes` inline bytes, into the next call
that frees up, so a call's size grows with the load and the wait stays about one call.

Merging never reorders one object's events: two runs share an object only when the
keyed runner has ordered them, and then the second is submitted only after the first
has finished, so no two waiting runs hold events of one object.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from controlplane.domain.events import ChangeEvent
from replicator.ports import ApplyResult

Answers = list[ApplyResult | Exception]
Call = Callable[[list[ChangeEvent]], Awaitable[Answers]]


@dataclass
class _Run:
    events: Sequence[ChangeEvent]
    weight: int
    answer: asyncio.Future[Answers]
    call: asyncio.Task[None] | None = None  # the call it went out in


@dataclass
class _Group:
    runs: list[_Run] = field(default_factory=list)


class CoalescedCalls:
    def __init__(self, call: Call, *, max_calls: int, max_events: int, max_bytes: int) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self._call = call
        self._max_calls = max_calls
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._waiting: deque[_Run] = deque()
        self._calls: dict[asyncio.Task[None], _Group] = {}

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    @property
    def waiting(self) -> int:
        """Runs waiting for a free call (their submitters not cancelled)."""
        return sum(1 for run in self._waiting if not run.answer.done())

    async def submit(self, events: Sequence[ChangeEvent]) -> Answers:
        """The agent's answers to `events`, in order, from a call they may share with
        other runs; the call's exception if it failed as a whole."""
        weight = sum(len(e.inline or b"") for e in events)
        run = _Run(events, weight, asyncio.get_running_loop().create_future())
        self._waiting.append(run)
        self._dispatch()
        try:
            return await run.answer
        except asyncio.CancelledError:
            run.answer.cancel()
            task = run.call
            # The call may have ended (and left `_calls`) in the same step as this
            # cancellation: then there is nothing to cancel, and the cancel must go on.
            group = self._calls.get(task) if task is not None else None
            if task is not None and group is not None and all(r.answer.done() for r in group.runs):
                task.cancel()  # nobody waits for this call's answers any more
            raise

    def _dispatch(self) -> None:
        while self._waiting and len(self._calls) < self._max_calls:
            group = _Group()
            count = size = 0
            while self._waiting:
                run = self._waiting[0]
                if run.answer.done():  # its submitter was cancelled while it waited
                    self._waiting.popleft()
                    continue
                if group.runs and (
                    count + len(run.events) > self._max_events
                    or size + run.weight > self._max_bytes
                ):
                    break
                self._waiting.popleft()
                group.runs.append(run)
                count += len(run.events)
                size += run.weight
            if not group.runs:
                return
            task = asyncio.create_task(self._send(group), name="apply-many")
            for run in group.runs:
                run.call = task
            self._calls[task] = group

    async def _send(self, group: _Group) -> None:
        events = [e for run in group.runs for e in run.events]
        try:
            answers = await self._call(events)
            if len(answers) != len(events):
                raise RuntimeError(
                    f"the agent answered {len(answers)} items of a batch of {len(events)}"
                )
        except Exception as exc:  # noqa: BLE001 - each submitter decides what to do with it
            for run in group.runs:
                if not run.answer.done():
                    run.answer.set_exception(exc)
        else:
            at = 0
            for run in group.runs:
                if not run.answer.done():
                    run.answer.set_result(answers[at : at + len(run.events)])
                at += len(run.events)
        finally:
            current = asyncio.current_task()
            assert current is not None  # noqa: S101 - runs as a task
            self._calls.pop(current, None)
            self._dispatch()
