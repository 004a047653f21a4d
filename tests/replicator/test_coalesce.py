"""`CoalescedCalls`: runs that wait for a free call merge into it, within its bounds."""

from __future__ import annotations

import asyncio

import pytest
import repl_builders as b
from waiting import until

from controlplane.domain.events import ChangeEvent
from replicator.coalesce import CoalescedCalls
from replicator.ports import ApplyOutcome, ApplyResult


class HeldAgent:
    """`apply_many` that records each call's events and waits until released."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def apply_many(self, events: list[ChangeEvent]) -> list[ApplyResult | Exception]:
        self.calls.append([e.key for e in events])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [ApplyResult(ApplyOutcome.APPLIED, e.version) for e in events]


def runs(count: int, size: int, data: bytes = b"x") -> list[list[ChangeEvent]]:
    return [[b.put(f"r{r}-{i}", data) for i in range(size)] for r in range(count)]


async def queued(calls: CoalescedCalls, agent: HeldAgent, *, sent: int, waiting: int) -> None:
    """Until `sent` calls have reached the agent and `waiting` runs wait for a free one
    (the submitters run as tasks: they reach the queue only once they are scheduled)."""
    await until(
        lambda: len(agent.calls) == sent and calls.waiting == waiting,
        5,
        what=f"{sent} calls out and {waiting} runs waiting",
        step_s=0.005,
        detail=lambda: (agent.calls, calls.waiting),
    )


async def test_waiting_runs_merge_within_the_bounds_and_get_their_own_answers() -> None:
    agent = HeldAgent()
    calls = CoalescedCalls(agent.apply_many, max_calls=1, max_events=5, max_bytes=10**6)
    batches = runs(5, 2)
    tasks = [asyncio.create_task(calls.submit(r)) for r in batches]
    await queued(calls, agent, sent=1, waiting=4)
    assert calls.in_flight == 1  # the others wait
    agent.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    # The first alone, then the four that waited, two by two (a third would pass 5).
    assert [len(c) for c in agent.calls] == [2, 4, 4]
    for run, got in zip(batches, answers, strict=True):
        assert [a.held for a in got if isinstance(a, ApplyResult)] == [e.version for e in run]
    assert calls.in_flight == 0


async def test_the_byte_bound_splits_merged_calls() -> None:
    agent = HeldAgent()
    calls = CoalescedCalls(agent.apply_many, max_calls=1, max_events=100, max_bytes=2500)
    tasks = [asyncio.create_task(calls.submit(r)) for r in runs(4, 1, b"z" * 1000)]
    await queued(calls, agent, sent=1, waiting=3)
    agent.release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [len(c) for c in agent.calls] == [1, 2, 1]


async def test_a_failed_call_fails_each_of_its_runs() -> None:
    agent = HeldAgent()
    agent.fail = RuntimeError("agent away")
    calls = CoalescedCalls(agent.apply_many, max_calls=1, max_events=100, max_bytes=10**6)
    tasks = [asyncio.create_task(calls.submit(r)) for r in runs(3, 1)]
    await queued(calls, agent, sent=1, waiting=2)
    agent.release.set()
    got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert [str(g) for g in got] == ["agent away"] * 3
    assert [len(c) for c in agent.calls] == [1, 2]


async def test_a_cancelled_run_leaves_its_call_or_its_wait() -> None:
    agent = HeldAgent()
    calls = CoalescedCalls(agent.apply_many, max_calls=1, max_events=100, max_bytes=10**6)
    first, second, third = (asyncio.create_task(calls.submit(r)) for r in runs(3, 1))
    await queued(calls, agent, sent=1, waiting=2)
    second.cancel()  # waiting: it never goes out
    first.cancel()  # alone in its call: the call is cancelled
    await queued(calls, agent, sent=2, waiting=0)  # the third went out in its place
    assert calls.in_flight == 1 and agent.calls[-1] == ["r2-0"]
    agent.release.set()
    assert len(await asyncio.wait_for(third, 5)) == 1
    for task in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert agent.calls == [["r0-0"], ["r2-0"]]
