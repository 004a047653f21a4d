"""A policy snapshot that cannot decide an event (its published rules do not rebuild,
for a dataset first seen after the apply) holds the event back, fails closed, instead
of ending its whole batch undone: once a readable policy is applied, every event of
the batch is applied and said done (so its offsets are committed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import repl_builders as b
from repl_rig import RigFactory
from structlog.testing import capture_logs
from waiting import until

from controlplane.errors import InvalidInputError
from controlplane.policy.current import CompiledPolicy
from replicator import applier as applier_module
from replicator.service import ReplicatorLoop

NEW = "new/ds"  # first seen after the apply: placed by the published rules


class UnreadableRules:
    """A snapshot whose rules do not rebuild: a dataset it has no placement of raises."""

    def __init__(self, inner: CompiledPolicy) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def placement(self, dataset: str, labels: Mapping[str, str] | None = None) -> Any:
        if dataset not in self._inner.placements:
            raise InvalidInputError("meridian/policy: the published rules cannot be rebuilt")
        return self._inner.placement(dataset, labels)


async def test_an_event_the_policy_cannot_decide_waits_and_its_batch_is_not_lost(
    rig_factory: RigFactory,
) -> None:
    rig = rig_factory()
    rig.current[0] = UnreadableRules(b.policy())  # type: ignore[assignment]

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._sleep = short_sleep
    events = [b.put("a"), b.put("x", dataset=NEW), b.put("c")]
    records = [b.rec_of(e, offset=n) for n, e in enumerate(events)]
    done: list[int] = []

    def on_done(indices: Sequence[int]) -> None:
        done.extend(indices)

    with capture_logs() as logs:
        run = asyncio.create_task(rig.applier.handle_many(records, on_done))

        async def waiting_for_a_policy() -> bool:
            return any(e["event"] == "policy_cannot_decide" for e in logs)

        await until(waiting_for_a_policy, 10, what="the applier to wait for a readable policy")
        assert not run.done()
        # A readable policy that places the new dataset here too.
        rig.current[0] = b.policy(b.placement(), b.placement(dataset=NEW))
        results = await asyncio.wait_for(run, 10)
    assert results == ["applied", "applied", "applied"]
    assert sorted(done) == [0, 1, 2]
    assert {k for k in rig.agent.held} == {("corpus/web", "a"), (NEW, "x"), ("corpus/web", "c")}
    cannot = [e for e in logs if e["event"] == "policy_cannot_decide"]
    assert cannot[0]["dataset"] == NEW and "cannot be rebuilt" in str(cannot[0]["error"])


async def test_a_run_whose_apply_crashed_is_run_again_not_dropped(
    rig_factory: RigFactory,
) -> None:
    # A bug in the applier (it handles every failure of an event itself) must not drop
    # the run: its events would be left undone and its offsets never committed.
    rig = rig_factory(retry_initial_s=0.01, retry_max_s=0.02)
    handle_many = rig.applier.handle_many
    crashes = [1]

    async def crashing_once(*args: Any, **kwargs: Any) -> list[str]:
        if crashes[0]:
            crashes[0] -= 1
            raise RuntimeError("a bug")
        return await handle_many(*args, **kwargs)

    rig.applier.handle_many = crashing_once  # type: ignore[method-assign]
    rig.publish(b.put("a"), b.put("b"))
    with capture_logs() as logs:
        async with rig.loop():
            await b.until(rig.log.changed, lambda: rig.log.lag() == 0)
    assert crashes == [0]
    assert {k for _, k in rig.agent.held} == {"a", "b"}
    assert [e["event"] for e in logs if e["event"] in ("apply_crashed", "apply_retry")] == [
        "apply_crashed",
        "apply_retry",
    ]


async def test_an_event_of_a_newer_revision_waits_for_it_rather_than_being_skipped(
    rig_factory: RigFactory,
) -> None:
    # us-east's snapshot is revision 2, where the dataset is not placed there; the
    # write was admitted under revision 3, which places a copy in us-east.
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._sleep = short_sleep
    event = b.put("a")  # policy_revision 3
    with capture_logs() as logs:
        run = asyncio.create_task(rig.applier.handle_many([b.rec_of(event)]))

        async def behind() -> bool:
            return any(e["event"] == "policy_behind_event" for e in logs)

        await until(behind, 10, what="the applier to wait for revision 3")
        assert not run.done() and rig.agent.held == {}
        wider = b.placement(replicas=("eu-central", "us-east"), residency=("EU", "US"))
        rig.current[0] = b.policy(wider, revision=3)
        assert await asyncio.wait_for(run, 10) == ["applied"]
    assert rig.agent.held[("corpus/web", "a")] == event.version


async def test_an_event_of_an_older_revision_is_skipped_at_once(rig_factory: RigFactory) -> None:
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=5)  # us-east not placed
    assert await rig.applier.handle_many([b.rec_of(b.put("a"))]) == ["skipped"]


async def test_a_revision_that_never_comes_is_waited_for_a_bounded_time_once(
    rig_factory: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Revision 9 never reaches this view (a catalog rebuilt since, say): after the
    # bound, its events are decided on the snapshot, and the bound is spent once for
    # the revision, not once per event.
    monkeypatch.setattr(applier_module, "POLICY_BEHIND_MAX_S", 0.2)
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)  # us-east not placed

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._sleep = short_sleep
    events = [b.put(f"k{i}", policy_revision=9) for i in range(20)]
    with capture_logs() as logs:
        results = await asyncio.wait_for(
            rig.applier.handle_many([b.rec_of(e, n) for n, e in enumerate(events)]), 10
        )
    assert results == ["skipped"] * 20
    assert [e["event"] for e in logs].count("policy_behind_event_decided") == 1  # once
    waits = [e for e in logs if e["event"] == "policy_behind_event"]
    assert 1 <= len(waits) <= 40  # about one bound's worth of 10 ms retries, not 20 of them


async def test_a_revision_etcd_does_not_hold_is_not_waited_for(rig_factory: RigFactory) -> None:
    # Events of a catalog rebuilt since (or of another deployment on the same log):
    # etcd itself holds revision 2, so revision 9 is never coming.
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)
    asked: list[int] = []

    async def published() -> int | None:
        asked.append(2)
        return 2

    rig.applier._published_revision = published
    events = [b.put(f"k{i}", policy_revision=9) for i in range(5)]
    with capture_logs() as logs:
        results = await asyncio.wait_for(
            rig.applier.handle_many([b.rec_of(e, n) for n, e in enumerate(events)]), 10
        )
    assert results == ["skipped"] * 5
    assert not [e for e in logs if e["event"] == "policy_behind_event"]
    assert [e["event"] for e in logs].count("policy_revision_unpublished") == 1
    assert asked == [2]  # asked once for the revision, not once per event


async def test_an_unpublished_verdict_goes_stale_once_the_view_moves(
    rig_factory: RigFactory,
) -> None:
    # Revision 9 was not in etcd while the view stood at 2. The view has moved to 3
    # since, and etcd now holds 9: an event of revision 9 waits for it again, and is
    # applied under it, instead of being skipped on the old verdict.
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)
    etcd_holds = [2]

    async def published() -> int | None:
        return etcd_holds[0]

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._published_revision = published
    rig.applier._sleep = short_sleep
    first = await asyncio.wait_for(
        rig.applier.handle_many([b.rec_of(b.put("a", policy_revision=9))]), 10
    )
    assert first == ["skipped"]
    rig.current[0] = b.policy(b.placement(), revision=3)
    etcd_holds[0] = 9
    with capture_logs() as logs:
        run = asyncio.create_task(
            rig.applier.handle_many([b.rec_of(b.put("b", policy_revision=9), 1)])
        )

        async def behind() -> bool:
            return any(e["event"] == "policy_behind_event" for e in logs)

        await until(behind, 10, what="the applier to wait for revision 9 again")
        wider = b.placement(replicas=("eu-central", "us-east"), residency=("EU", "US"))
        rig.current[0] = b.policy(wider, revision=9)
        assert await asyncio.wait_for(run, 10) == ["applied"]


async def test_a_revision_etcd_holds_is_waited_for(rig_factory: RigFactory) -> None:
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)

    async def published() -> int | None:
        return 3  # the view lags etcd

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._published_revision = published
    rig.applier._sleep = short_sleep
    with capture_logs() as logs:
        run = asyncio.create_task(rig.applier.handle_many([b.rec_of(b.put("a"))]))

        async def behind() -> bool:
            return any(e["event"] == "policy_behind_event" for e in logs)

        await until(behind, 10, what="the applier to wait for revision 3")
        wider = b.placement(replicas=("eu-central", "us-east"), residency=("EU", "US"))
        rig.current[0] = b.policy(wider, revision=3)
        assert await asyncio.wait_for(run, 10) == ["applied"]


async def test_with_etcd_away_the_bound_is_spent_once_not_once_per_event(
    rig_factory: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # etcd does not answer (each direct read waits out its timeout, here 0.1 s): once the
    # revision's bound passed, its other events are decided without asking etcd again.
    monkeypatch.setattr(applier_module, "POLICY_BEHIND_MAX_S", 0.3)
    rig = rig_factory(region="us-east")
    rig.current[0] = b.policy(b.placement(), revision=2)
    asked: list[float] = []

    async def etcd_away() -> int | None:
        asked.append(time.monotonic())
        await asyncio.sleep(0.1)
        return None

    async def short_sleep(_s: float) -> None:
        await asyncio.sleep(0.01)

    rig.applier._published_revision = etcd_away
    rig.applier._sleep = short_sleep
    events = [b.put(f"k{i}", policy_revision=9) for i in range(50)]
    started = time.monotonic()
    results = await asyncio.wait_for(
        rig.applier.handle_many([b.rec_of(e, n) for n, e in enumerate(events)]), 10
    )
    assert results == ["skipped"] * 50
    assert len(asked) <= 2  # at most once a second, and never past the bound
    assert time.monotonic() - started < 3  # 50 asks would take 5 s


async def test_a_crashing_run_is_given_up_once_its_partitions_are_revoked(
    rig_factory: RigFactory,
) -> None:
    # Another member owns them then, and replays them from its commit: this one stops.
    rig = rig_factory(retry_initial_s=0.01, retry_max_s=0.02, drain_timeout_s=0.3)

    async def always_crashing(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("a bug")

    rig.applier.handle_many = always_crashing  # type: ignore[method-assign]
    loop = ReplicatorLoop(rig.config, rig.log, rig.applier, rig.metrics, assigned_by_rebalance=True)
    everything = {(rig.log.topic, p) for p in range(4)}
    with capture_logs() as logs:
        await loop.on_assigned(everything)
        rig.publish(b.put("a"))
        await loop.start()
        try:

            async def retrying() -> bool:
                return any(e["event"] == "apply_retry" for e in logs)

            await until(retrying, 10, what="the crashed run to be retried")
            await loop.on_revoked(everything)

            async def abandoned() -> bool:
                return any(e["event"] == "apply_abandoned" for e in logs)

            await until(abandoned, 10, what="the run to be given up")
        finally:
            await asyncio.wait_for(loop.stop(), 10)
