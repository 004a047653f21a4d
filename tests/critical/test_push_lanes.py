"""The owner's push lane to one region (agents/replication/push_lanes.py), on faked
calls: a lone push goes at once in a call of its own; pushes queued behind a running
call go together in one call, one version of a key per call; each keeps its own
answer; an agent that takes no batch gets its items pushed alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from placements import critical
from waiting import until

from agents.admission import Admitted
from agents.metrics import AgentMetrics
from agents.replication.push_lanes import BatchRefusedError, PushLane
from agents.service.servicer import CommittedWrite
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Version
from controlplane.errors import MeridianError, UnavailableError

REGION = "eu-north"
CLOCK = HybridClock("eu-west")
PLACEMENT = critical(
    "ckpt/lanes", replicas=("eu-central", REGION), policy="checkpoints", failover_mode="automatic"
)


def write(key: str) -> tuple[CommittedWrite, Version]:
    version = Version(CLOCK.now(), "delete", 0, None)
    return CommittedWrite(
        Admitted(PLACEMENT, 5, 1), "ckpt/lanes", key=key, version=version
    ), version


class Calls:
    """The faked calls: each waits for `gate`; `together` answers `answer` per item, or
    refuses every batch (`refuse`: an agent that takes none)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.alone: list[str] = []
        self.together: list[list[str]] = []
        self.answer: dict[str, MeridianError] = {}
        self.refuse = False

    async def push_alone(self, w: CommittedWrite, _v: Version, _deadline: float) -> str:
        self.alone.append(w.key or "")
        await asyncio.wait_for(self.gate.wait(), timeout=5)
        return REGION

    async def push_together(
        self, items: list[tuple[CommittedWrite, Version]], _deadline: float
    ) -> list[MeridianError | None]:
        if self.refuse:
            raise BatchRefusedError("takes no batch")
        self.together.append([w.key or "" for w, _ in items])
        await asyncio.wait_for(self.gate.wait(), timeout=5)
        return [self.answer.get(w.key or "") for w, _ in items]

    def lane(self) -> PushLane:
        return PushLane(REGION, alone=self.push_alone, together=self.push_together, in_flight=1)


async def test_a_lone_push_goes_at_once_in_a_call_of_its_own() -> None:
    calls = Calls()
    calls.gate.set()
    lane = calls.lane()
    assert await lane.submit(*write("a"), 5.0) == REGION
    # One item of ReplicatePushes (cheaper than a streamed Replicate), not a batch.
    assert calls.together == [["a"]] and calls.alone == [] and lane.batches == 0


async def test_pushes_queued_behind_a_call_go_together_one_version_of_a_key_each() -> None:
    calls = Calls()
    lane = calls.lane()
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.together == [["a"]], timeout_s=5, what="the first push under way")
    queued = [lane.submit(*write(k), 5.0) for k in ("b", "c", "b")]
    # They queue: the only call slot is taken.
    await until(lambda: lane.queued == 3, timeout_s=5, what="three pushes queued")
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, *queued), timeout=5) == [REGION] * 4
    # b and c in one call; the second version of b in the next (a call of one).
    assert calls.together == [["a"], ["b", "c"], ["b"]]
    assert calls.alone == [] and lane.batches == 1


async def test_each_item_of_a_call_keeps_its_own_answer() -> None:
    calls = Calls()
    calls.answer["c"] = StaleEpochError("epoch 5 is older than 9")
    lane = calls.lane()
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.together == [["a"]], timeout_s=5, what="the first push under way")
    b = lane.submit(*write("b"), 5.0)
    c = lane.submit(*write("c"), 5.0)
    await until(lambda: lane.queued == 2, timeout_s=5, what="two pushes queued")
    calls.gate.set()
    assert await asyncio.wait_for(first, 5) == REGION
    assert await asyncio.wait_for(b, 5) == REGION
    with pytest.raises(StaleEpochError):
        await asyncio.wait_for(c, 5)
    assert calls.together == [["a"], ["b", "c"]]


async def test_a_lone_push_refused_as_a_batch_keeps_its_own_error() -> None:
    calls = Calls()
    calls.answer["a"] = StaleEpochError("epoch 5 is older than 9")
    calls.gate.set()
    with pytest.raises(StaleEpochError):
        await calls.lane().submit(*write("a"), 5.0)


async def test_an_agent_taking_no_batch_gets_each_item_alone() -> None:
    calls = Calls()
    calls.refuse = True
    lane = calls.lane()
    first = lane.submit(*write("a"), 5.0)
    # Refused as a batch of one: pushed alone, and no batch is tried again meanwhile.
    await until(lambda: calls.alone == ["a"], timeout_s=5, what="the first push under way")
    queued = [lane.submit(*write(k), 5.0) for k in ("b", "c")]
    await until(lambda: lane.queued == 2, timeout_s=5, what="two pushes queued")
    calls.refuse = False  # within REFUSED_FOR_S: still pushed alone
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, *queued), timeout=5) == [REGION] * 3
    assert sorted(calls.alone) == ["a", "b", "c"] and calls.together == []
    assert lane.batches == 0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def timed_lane(
    calls: Calls, clock: Callable[[], float] | None = None
) -> tuple[PushLane, Callable[..., float]]:
    metrics = AgentMetrics("eu-west")
    lane = PushLane(
        REGION,
        alone=calls.push_alone,
        together=calls.push_together,
        in_flight=1,
        clock=clock or Clock(),
        metrics=metrics,
    )

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"to_region": REGION, **labels}) or 0.0

    return lane, sample


async def test_the_lane_times_each_wait_and_each_call_in_its_metrics() -> None:
    calls, clock = Calls(), Clock()
    lane, sample = timed_lane(calls, clock)
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.together == [["a"]], timeout_s=5, what="the first push under way")
    queued = [lane.submit(*write(k), 5.0) for k in ("b", "c")]
    await until(lambda: lane.queued == 2, timeout_s=5, what="two pushes queued")
    held_s = 0.05
    clock.now += held_s  # the lane's clock: the queued pushes wait this long
    calls.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), timeout=5)

    # Three pushes waited: "a" not at all, "b" and "c" for the first call to end.
    count, total = "meridian_critical_push_seconds_count", "meridian_critical_push_seconds_sum"
    assert sample(count, stage="queued") == 3
    assert sample(total, stage="queued") == pytest.approx(2 * held_s)
    # Two calls: "a" alone, then "b" and "c" together; the first took the held time.
    assert sample(count, stage="call") == 2
    assert sample(total, stage="call") == pytest.approx(held_s)
    assert sample("meridian_critical_push_items_sum") == 3
    assert sample("meridian_critical_push_items_count") == 2


async def test_a_region_that_takes_no_batch_is_timed_call_by_call() -> None:
    calls = Calls()
    calls.refuse = True
    lane, sample = timed_lane(calls)
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.alone == ["a"], timeout_s=5, what="the first push under way")
    queued = [lane.submit(*write(k), 5.0) for k in ("b", "c")]
    await until(lambda: lane.queued == 2, timeout_s=5, what="two pushes queued")
    calls.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *queued), timeout=5)

    assert calls.alone == ["a", "b", "c"]
    # Four calls of one version each: the refused batch of "a", then a Replicate each.
    assert sample("meridian_critical_push_seconds_count", stage="call") == 4
    assert sample("meridian_critical_push_items_count") == 4
    assert sample("meridian_critical_push_items_sum") == 4
    assert sample("meridian_critical_push_seconds_count", stage="queued") == 3


async def busy_lane(
    calls: Calls, *, linger_s: float, clock: Callable[[], float] | None = None
) -> tuple[PushLane, asyncio.Task[str]]:
    """A lane of 2 call slots with a call of `a` under way, whose recent calls carried
    8 versions each (set, not driven there: the running mean moves a tenth per call)."""
    lane = PushLane(
        REGION,
        alone=calls.push_alone,
        together=calls.push_together,
        in_flight=2,
        linger_s=linger_s,
        **({} if clock is None else {"clock": clock}),
    )
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.together == [["a"]], timeout_s=5, what="the first push under way")
    lane._carried = 8.0
    return lane, first


async def test_a_busy_lane_holds_a_short_queue_for_the_rest_of_its_wave() -> None:
    """While a call runs, a free slot is not spent on one version when the lane's calls
    carry several: the queue waits until it is worth a call, then goes at once."""
    calls = Calls()
    lane, first = await busy_lane(calls, linger_s=30.0)  # longer than the test: the queue sends
    wave = [lane.submit(*write("b"), 5.0)]
    # Queued with a call slot free (a greedy lane sends it at once, never queues it).
    await until(lambda: lane.queued == 1, timeout_s=5, what="b queued")
    assert calls.together == [["a"]]
    wave += [lane.submit(*write(k), 5.0) for k in "cdefghi"]
    await until(lambda: len(calls.together) == 2, timeout_s=5, what="the wave's call")
    assert calls.together[1] == list("bcdefghi")
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, *wave), timeout=5) == [REGION] * 9


async def test_a_held_queue_goes_once_it_has_waited_the_linger() -> None:
    calls = Calls()
    lane, first = await busy_lane(calls, linger_s=0.1)
    started = asyncio.get_running_loop().time()
    alone = lane.submit(*write("b"), 5.0)
    await until(lambda: len(calls.together) == 2, timeout_s=5, what="b's own call")
    assert asyncio.get_running_loop().time() - started >= 0.09  # it waited, then went
    assert calls.together == [["a"], ["b"]]
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, alone), timeout=5) == [REGION] * 2


async def test_a_lane_of_lone_writes_never_holds_one() -> None:
    """Calls of a version or two (few writers): a free slot takes a push at once, and an
    idle lane always does."""
    calls = Calls()
    lane = PushLane(
        REGION, alone=calls.push_alone, together=calls.push_together, in_flight=2, linger_s=30.0
    )
    first = lane.submit(*write("a"), 5.0)
    second = lane.submit(*write("b"), 5.0)
    await until(lambda: len(calls.together) == 2, timeout_s=5, what="both pushes under way")
    assert calls.together == [["a"], ["b"]]
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), timeout=5) == [REGION] * 2


async def test_a_held_queue_goes_after_the_linger_whatever_the_lane_s_clock_says() -> None:
    """The linger is ended by the loop's timer: a lane whose clock stands still (a
    faked one) still sends the held push once the timer fired."""
    calls = Calls()
    lane, first = await busy_lane(calls, linger_s=0.05, clock=Clock())
    alone = lane.submit(*write("b"), 5.0)
    await until(lambda: len(calls.together) == 2, timeout_s=5, what="b's own call")
    assert calls.together == [["a"], ["b"]]
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, alone), timeout=5) == [REGION] * 2


async def test_the_next_wave_waits_its_own_linger() -> None:
    """A timer armed for a push that went with its wave does not cut short the linger
    of the next wave's first push."""
    calls = Calls()
    lane, first = await busy_lane(calls, linger_s=0.3)
    wave = [lane.submit(*write(k), 5.0) for k in "bcdefghi"]
    await until(lambda: len(calls.together) == 2, timeout_s=5, what="the wave's call")
    lane.in_flight = 3  # a slot free for the next wave
    lane._carried = 8.0
    started = asyncio.get_running_loop().time()
    late = lane.submit(*write("j"), 5.0)
    await until(lambda: len(calls.together) == 3, timeout_s=5, what="j's own call")
    assert asyncio.get_running_loop().time() - started >= 0.27  # its own linger, whole
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, late, *wave), timeout=5) == [REGION] * 10


async def test_a_lane_learns_what_its_calls_carry() -> None:
    """The running mean that decides whether a short queue waits rises with batches and
    falls back with lone calls."""
    calls = Calls()
    calls.gate.set()
    lane = PushLane(REGION, alone=calls.push_alone, together=calls.push_together, in_flight=1)
    assert lane._worth() == 1
    for n in range(20):
        first = lane.submit(*write(f"a{n}"), 5.0)
        rest = [lane.submit(*write(f"{k}{n}"), 5.0) for k in "bcdefghij"]
        await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5)
    assert lane._worth() >= 4  # calls of 1 and 9 versions, alternately
    for n in range(40):
        await lane.submit(*write(f"z{n}"), 5.0)
    assert lane._worth() == 1


async def test_a_region_that_takes_no_batch_is_never_held() -> None:
    """Each item to such a region goes in a call of its own anyway: nothing to wait for."""
    calls = Calls()
    calls.refuse = True
    lane = PushLane(
        REGION, alone=calls.push_alone, together=calls.push_together, in_flight=2, linger_s=30.0
    )
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.alone == ["a"], timeout_s=5, what="a pushed alone")
    lane._carried = 8.0
    second = lane.submit(*write("b"), 5.0)
    await until(lambda: calls.alone == ["a", "b"], timeout_s=5, what="b pushed at once")
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), timeout=5) == [REGION] * 2


async def test_a_push_cancelled_before_it_starts_gives_its_call_slot_back() -> None:
    # The slot is taken as the push is submitted; cancelled before its first step (its
    # write's call ended in the same turn), it must still be given back, or after
    # `in_flight` of these the lane would send nothing again.
    calls = Calls()
    calls.gate.set()
    lane = calls.lane()
    for _ in range(3):
        lane.submit(*write("a"), 5.0).cancel()
        await until(lambda: lane._running == 0, 5.0, "the slot given back")
    assert await lane.submit(*write("b"), 5.0) == REGION
    assert lane._running == 0


async def test_a_push_queued_for_its_whole_deadline_fails_unsent() -> None:
    """The call ahead hangs (a region cut off): a push that waited its whole deadline
    in the queue is failed, not sent after it (the region is caught up instead), so
    the queue never holds more than a deadline's worth of writes."""
    now = [0.0]
    calls = Calls()
    lane = PushLane(
        REGION,
        alone=calls.push_alone,
        together=calls.push_together,
        in_flight=1,
        clock=lambda: now[0],
    )
    first = lane.submit(*write("a"), 5.0)
    await until(lambda: calls.together == [["a"]], timeout_s=5, what="the first push under way")
    late = lane.submit(*write("b"), 2.0)
    now[0] = 3.0  # b has waited past its 2 s
    fresh = lane.submit(*write("c"), 5.0)
    calls.gate.set()
    with pytest.raises(UnavailableError, match="waited its whole deadline"):
        await asyncio.wait_for(late, 5)
    assert await asyncio.wait_for(asyncio.gather(first, fresh), 5) == [REGION] * 2
    assert calls.together == [["a"], ["c"]]  # b never sent
