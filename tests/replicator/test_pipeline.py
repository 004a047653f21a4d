"""The replicator's pipeline on hand-made events, with a fake agent (replicator.ports)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest
import repl_builders as b
import waiting
from repl_rig import Rig, RigFactory

from chaos.catalog_inventory import dlq_copy
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import system_ms
from controlplane.errors import UnavailableError
from controlplane.ports.changelog import Record
from meridian.convert import decode_log_event
from replicator.ports import ApplyOutcome, ApplyResult, Source


def rec(event_value: bytes, offset: int = 0, key: bytes = b"corpus/web/a") -> Record:
    return Record("meridian.changes", 0, offset, key, event_value)


async def handle(rig: Rig, *events: object) -> list[str]:
    out = []
    for i, e in enumerate(events):
        value = e if isinstance(e, bytes) else b.value(e)  # type: ignore[arg-type]
        out.append(await rig.applier.handle(rec(value, i)))
    return out


# -- LWW ------------------------------------------------------------------------------


async def test_a_replayed_older_put_never_overwrites_a_newer_delete(rig: Rig) -> None:
    t = system_ms() - 10_000
    older_put = b.put("a", b"v1", wall_ms=t)
    newer_delete = b.delete("a", wall_ms=t + 5)
    assert await handle(rig, older_put, newer_delete, older_put) == ["applied", "applied", "older"]
    assert rig.agent.held[("corpus/web", "a")] == newer_delete.version
    assert [e.how for e in rig.agent.effects] == ["inline", "delete"]


async def test_an_exact_hlc_tie_converges_and_a_replay_is_a_no_op(
    rig_factory: RigFactory,
) -> None:
    t = system_ms() - 1000
    one = b.put("a", b"from-one", wall_ms=t, origin="us-east")
    other = b.put("a", b"from-other", wall_ms=t, origin="us-east", event_id="twin")
    # Two regions receive the twins in opposite orders; both keep the first they held,
    # then a newer write settles both on one version.
    first, second = rig_factory(), rig_factory()
    first.current[0] = second.current[0] = b.policy(
        b.placement(home="us-east", replicas=("eu-central",), residency=("EU", "US"))
    )
    assert await handle(first, one, other, one) == ["applied", "collision", "same"]
    assert await handle(second, other, one) == ["applied", "collision"]
    newer = b.put("a", b"final", wall_ms=t, logical=1, origin="us-east")
    await handle(first, newer)
    await handle(second, newer)
    assert first.agent.held == second.agent.held
    assert first.agent.held[("corpus/web", "a")] == newer.version
    assert len(first.agent.effects) == 2  # the twin and the replay changed nothing


async def test_any_arrival_order_converges_on_the_newest(rig_factory: RigFactory) -> None:
    t = system_ms() - 1000
    events = [
        b.put("a", b"1", wall_ms=t),
        b.delete("a", wall_ms=t + 1),
        b.put("a", b"3", wall_ms=t + 1, logical=1),
        b.put("a", b"4", wall_ms=t + 1, logical=1, origin="eu-central"),  # region breaks the tie
    ]
    # eu-central's own write is skipped by eu-central: use us-east as the receiver.
    pol = b.policy(b.placement(replicas=("eu-central", "us-east"), residency=("EU", "US")))
    finals = set()
    for order in itertools.permutations(events):
        r = rig_factory(region="us-east", policy=pol)
        await handle(r, *order)
        finals.add(r.agent.held[("corpus/web", "a")])
    assert finals == {events[2].version}  # "eu-central" < "eu-west" byte-wise


# -- guard, quarantine, dead letters ---------------------------------------------------


async def test_undecodable_bytes_are_dead_lettered_and_the_rest_flows(rig: Rig) -> None:
    good = b.put("a")
    assert await handle(rig, b"\x08\x96\x01garbage", good) == ["dead-lettered", "applied"]
    ((letter, reason, detail),) = rig.letters.letters
    assert reason == "undecodable" and letter.value == b"\x08\x96\x01garbage"
    assert "ChangeEvent" in detail
    assert rig.metric("meridian_dlq_total", reason="undecodable") == 1


async def test_a_version_from_the_future_is_quarantined(rig: Rig) -> None:
    ahead = b.put("a", wall_ms=system_ms() + 60_000)
    assert await handle(rig, ahead) == ["dead-lettered"]
    assert rig.agent.calls == []
    assert rig.letters.letters[0][1] == "clock skew"
    assert rig.metric("meridian_dlq_total", reason="clock skew") == 1


async def test_own_events_and_other_regions_datasets_are_not_copied(
    rig_factory: RigFactory,
) -> None:
    r = rig_factory(region="eu-west")  # the home: its own write comes back to it
    assert await handle(r, b.put("a", origin="eu-west")) == ["own"]
    outsider = rig_factory(region="us-east")
    assert await handle(outsider, b.put("a")) == ["skipped"]
    assert r.agent.calls == outsider.agent.calls == []
    assert outsider.letters.letters == []


async def test_a_named_region_outside_the_residency_is_refused_and_recorded(
    rig_factory: RigFactory,
) -> None:
    pol = b.policy(b.placement(replicas=("eu-central", "us-east"), residency=("EU",)))
    r = rig_factory(region="us-east", policy=pol)
    event = b.put("a")
    assert await handle(r, event) == ["refused"]
    assert r.agent.calls == []
    letter, reason, _ = r.letters.letters[0]
    assert reason == "residency"
    # The letter is written by us-east, where the bytes may not live: they are left out.
    assert event.inline and event.inline not in letter.value
    kept = decode_log_event(letter.value)
    assert isinstance(kept, ChangeEvent) and kept.inline is None
    assert (kept.event_id, kept.key, kept.version) == (event.event_id, "a", event.version)
    assert dlq_copy({"region": b"us-east", "dataset": b"corpus/web"}, letter.value, 0, 0) is None
    (row,) = r.journal.pending()
    assert (row.record.kind, row.record.event_id, row.record.region) == (
        "refused",
        event.event_id,
        "us-east",
    )


async def test_deletes_retain_records_the_delete_and_keeps_the_copy(
    rig_factory: RigFactory,
) -> None:
    r = rig_factory(policy=b.policy(b.placement(deletes="retain")))
    t = system_ms() - 100
    assert await handle(r, b.put("a", wall_ms=t), b.delete("a", wall_ms=t + 1)) == [
        "applied",
        "retained",
    ]
    assert r.agent.held[("corpus/web", "a")].op == "put"
    states = [(row.record.op, row.record.state) for row in r.journal.pending()]
    assert states == [("put", "completed"), ("delete", "completed")]


# -- fetches, retries, failure ----------------------------------------------------------


async def test_large_objects_are_fetched_from_the_nearest_holder_first(
    rig_factory: RigFactory,
) -> None:
    class Holders:
        async def holders(self, event: object) -> list[Source]:
            return [Source("us-east", "us.agent:7000"), Source("eu-central", "me:7000")]

    pol = b.policy(
        b.placement(replicas=("eu-central", "us-east"), residency=("EU", "US")),
        rtt={("eu-west", "us-east"): 0.08, ("us-east", "eu-central"): 0.09},
    )
    r = rig_factory(region="eu-central", policy=pol)
    r.applier._holders = Holders()
    assert await handle(r, b.put("big", b"x" * 10, inline=False)) == ["applied"]
    (sources,) = r.agent.fetch_sources
    # eu-west (the origin) has no declared RTT to eu-central: it goes last; itself never.
    assert [s.region for s in sources] == ["us-east", "eu-west"]


async def test_a_failing_copy_is_retried_then_marked_failed(rig_factory: RigFactory) -> None:
    r = rig_factory(max_attempts=3)
    r.agent.failures = [UnavailableError(f"peer gone {i}") for i in range(3)]
    assert await handle(r, b.put("a")) == ["failed"]
    assert len(r.agent.calls) == 3
    rows = [(x.record.state, x.record.error) for x in r.journal.pending()]
    assert rows == [
        ("pending", "UnavailableError: peer gone 0"),
        ("pending", "UnavailableError: peer gone 1"),
        ("failed", "UnavailableError: peer gone 2"),
    ]
    assert (
        r.metric("meridian_replication_failed_total", dataset="corpus/web", region="eu-central")
        == 1
    )


async def test_an_unexpected_error_is_retried_like_a_retriable_one(rig_factory: RigFactory) -> None:
    # Not a MeridianError, so not known final: retried until max_attempts, then failed.
    r = rig_factory(max_attempts=2)
    r.agent.failures = [RuntimeError("surprise"), RuntimeError("again")]
    assert await handle(r, b.put("a")) == ["failed"]
    assert len(r.agent.calls) == 2
    assert [x.record.state for x in r.journal.pending()] == ["pending", "failed"]


async def test_an_unreachable_agent_spends_no_attempt_and_fails_nothing(
    rig_factory: RigFactory,
) -> None:
    r = rig_factory(max_attempts=2)
    r.agent.down_calls = 20  # ten rounds of a failed call and a failed probe
    assert await handle(r, b.put("a")) == ["applied"]
    assert [x.record.state for x in r.journal.pending()] == ["completed"]
    assert (
        r.metric("meridian_replication_failed_total", dataset="corpus/web", region="eu-central")
        == 0
    )


async def test_a_retry_that_succeeds_completes_the_replica(rig_factory: RigFactory) -> None:
    r = rig_factory(max_attempts=3)
    r.agent.failures = [UnavailableError("blip")]
    assert await handle(r, b.put("a")) == ["applied"]
    assert [x.record.state for x in r.journal.pending()] == ["pending", "completed"]


# -- the loop: order, concurrency, offsets ----------------------------------------------


async def test_one_objects_events_in_order_different_objects_at_once(
    rig_factory: RigFactory,
) -> None:
    rig = rig_factory(batch_max_events=1)  # one call per event: concurrency is visible
    rig.agent.gate = asyncio.Event()
    t = system_ms() - 1000
    keys = ["a", "b", "c"]
    for step in range(3):
        for k in keys:
            rig.publish(b.put(k, f"{k}{step}".encode(), wall_ms=t + step))
    loop = rig.loop()
    async with loop:
        await b.until(rig.agent.changed, lambda: rig.agent.running >= len(keys))
        # One call per object runs: the second event of an object waits for its first.
        assert rig.agent.running == len(keys)
        rig.agent.gate.set()
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert rig.agent.max_running == len(keys)
    for k in keys:
        order = [e.version.hlc.wall_ms - t for e in rig.agent.effects if e.key == k]
        assert order == [0, 1, 2]


async def test_the_offset_is_committed_only_after_the_effect(rig: Rig) -> None:
    rig.agent.gate = asyncio.Event()
    rig.publish(b.put("a"))
    loop = rig.loop()
    async with loop:
        await b.until(rig.agent.changed, lambda: rig.agent.running > 0)
        for _ in range(5):  # several commit intervals pass while the agent holds the call
            await asyncio.sleep(rig.config.commit_interval_s)
        assert rig.log.lag() == 1 and rig.agent.effects == []
        rig.agent.gate.set()
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert len(rig.agent.effects) == 1


async def test_a_redelivery_after_a_lost_commit_has_no_second_effect(rig: Rig) -> None:
    events = [b.put(k) for k in "abcdef"]
    rig.publish(*events)
    async with rig.loop():
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    # As if the commits were lost: everything comes again, to a new loop.
    rig.log.committed = dict.fromkeys(rig.log.committed, 0)
    rig.log.rewind()
    async with rig.loop():
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert len(rig.agent.calls) == 12
    assert len(rig.agent.effects) == 6
    assert rig.journal.buffered == 0  # the records were written before the offsets went
    assert rig.metric("meridian_replicator_events_total", result="same") == 6


@pytest.mark.parametrize("outcome", list(ApplyOutcome))
def test_only_a_held_version_completes_a_replica(outcome: ApplyOutcome) -> None:
    assert outcome.holds_version == (outcome in (ApplyOutcome.APPLIED, ApplyOutcome.SAME))


async def test_a_batch_holds_each_object_once_and_keeps_its_order(rig: Rig) -> None:
    t = system_ms() - 1000
    keys = ["a", "b", "c", "d"]
    events = [b.put(k, f"{k}{step}".encode(), wall_ms=t + step) for step in range(3) for k in keys]
    for e in [*events, b.delete("a", wall_ms=t + 3)]:
        rig.log.append(b.log_key(e), b.value(e), partition=0)
    async with rig.loop():
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    # One poll's run of 13 events: three batch calls (one per round of distinct objects),
    # then the delete of "a" alone, after its third put: never one object twice in a call.
    assert rig.agent.batches == [4, 4, 4]
    assert rig.agent.calls[-1][0] == "delete"
    for k in keys:
        order = [e.version.hlc.wall_ms - t for e in rig.agent.effects if e.key == k]
        assert order == ([0, 1, 2, 3] if k == "a" else [0, 1, 2])
    assert rig.metric("meridian_replicator_events_total", result="applied") == 13


async def test_a_batch_call_that_fails_is_retried_whole(rig: Rig) -> None:
    rig.agent.down_calls = 1  # the first call finds the agent away
    for e in [b.put(k) for k in "abcd"]:
        rig.log.append(b.log_key(e), b.value(e), partition=0)
    async with rig.loop():
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    # Not a burst of single calls at an agent that may be busy: the batch once more.
    assert rig.agent.batches == [4]
    assert [how for how, _ in rig.agent.calls] == ["inline"] * 4
    assert len(rig.agent.effects) == 4


async def test_one_polls_events_of_many_partitions_share_a_batch_call(rig: Rig) -> None:
    # An object's events are all in its key's partition, so a call may span partitions:
    # a poll spread over four partitions makes one call, not one per partition.
    t = system_ms() - 1000
    events = [b.put(k, wall_ms=t) for k in "abcdefgh"]
    for n, e in enumerate(events):
        rig.log.append(b.log_key(e), b.value(e), partition=n % 4)
    rig.log.append(b.log_key(events[0]), b.value(b.delete("a", wall_ms=t + 1)), partition=0)
    async with rig.loop():
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert rig.agent.batches == [8]
    assert rig.agent.calls[-1][0] == "delete"  # after the put of "a", in its own round
    assert rig.metric("meridian_replicator_events_total", result="applied") == 9


async def test_runs_waiting_for_a_busy_agent_go_out_merged(rig: Rig) -> None:
    # A trickle of events: each poll is a small run. While both batch calls are at the
    # agent, the runs of later polls wait and then go in ONE call, not a call each (a
    # call each queued 64 runs behind 2 calls: seconds of lag at 1,000 events/s).
    t = system_ms() - 1000
    rig.agent.gate = asyncio.Event()
    keys = iter(f"k{i:02d}" for i in range(20))

    def trickle(count: int) -> None:
        for _ in range(count):
            e = b.put(next(keys), wall_ms=t)
            rig.log.append(b.log_key(e), b.value(e), partition=0)

    def taken() -> int:
        return rig.log.position[0]

    async with rig.loop():
        for polls in range(1, 8):  # 2 runs at the agent, then 5 that wait
            trickle(2)
            await waiting.until(lambda n=polls: taken() == 2 * n, 5, f"poll {polls} taken")
            if polls <= rig.config.max_batch_calls:
                await b.until(rig.agent.changed, lambda n=polls: len(rig.agent.batches) == n)
        assert rig.agent.batches == [2, 2]
        rig.agent.gate.set()
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert rig.agent.batches == [2, 2, 10]
    assert len(rig.agent.effects) == 14
    assert rig.metric("meridian_replicator_events_total", result="applied") == 14


async def test_a_slow_fetch_holds_back_only_its_own_partitions_offsets(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One poll's run spans partitions; the fetch of partition 1 is held. The inline
    # puts of partitions 0 and 2 have their effect at once, so their offsets commit
    # meanwhile (they used to wait for the whole run, the held fetch included).
    t = system_ms() - 1000
    held = asyncio.Event()
    fetch = rig.agent.fetch

    async def slow_fetch(event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        await held.wait()
        return await fetch(event, sources)

    monkeypatch.setattr(rig.agent, "fetch", slow_fetch)
    for n, e in enumerate([b.put("a", wall_ms=t), b.put("big", wall_ms=t, inline=False)]):
        rig.log.append(b.log_key(e), b.value(e), partition=n)
    later = b.put("c", wall_ms=t)
    rig.log.append(b.log_key(later), b.value(later), partition=2)
    async with rig.loop():
        await b.until(
            rig.log.changed, lambda: rig.log.committed[0] == 1 and rig.log.committed[2] == 1
        )
        assert rig.log.committed[1] == 0  # the fetch's partition waits for its effect
        assert rig.metric("meridian_replicator_events_total", result="applied") == 2
        held.set()
        await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert sorted(e.key for e in rig.agent.effects) == ["a", "big", "c"]
