"""Runbooks (switchover, failover, drain, pause) against real etcd, catalog faked in memory."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.errors import CatalogUnavailableError
from controlplane.coordination.catalog_glue.sources import JournalEntry
from controlplane.coordination.orchestration.decide import Move
from controlplane.coordination.orchestration.failover import MoveTracker, apply_move
from controlplane.coordination.orchestration.runbooks import Runbooks, SwitchoverAbortedError
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.datasets import announce
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, FencedResource
from controlplane.coordination.protocols.follow import follow_ownership
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.protocols.view import RegionState, set_region_state
from controlplane.errors import (
    ConflictError,
    NotFoundError,
    OperationTimeoutError,
    RefusedError,
    UnavailableError,
)

from .helpers import REGIONS, critical, publish_world, wait_until

pytestmark = pytest.mark.integration


async def seed(coord: EtcdCoordination, alive: list[str], owners: dict[str, str]) -> int:
    lease = await coord.grant(60)
    for r in alive:
        await coord.put(keys.alive(r), b"{}", lease=lease.id)
    own = Ownership(coord)
    for d, r in owners.items():
        await own.claim(d, r, expect_epoch=0, reason="seed", actor="test")
    return lease.id


def runbooks(
    coord: EtcdCoordination, probe: MemoryCatchUp | None = None
) -> tuple[Runbooks, MemoryJournal]:
    placements = [
        critical("ckpt/a"),
        critical("ckpt/b", order=("us-east", "eu-north")),
        critical("ckpt/m", mode="manual"),
    ]
    journal = MemoryJournal()
    rb = Runbooks(
        coord,
        MemoryPlacements(REGIONS, placements),
        journal,
        probe or MemoryCatchUp(),
        actor="op@host",
    )
    return rb, journal


OWNERS = {"ckpt/a": "eu-west", "ckpt/b": "eu-west", "ckpt/m": "eu-west"}


async def test_plans_change_nothing(coord: EtcdCoordination) -> None:
    await seed(coord, ["eu-west", "eu-central", "eu-north", "us-east"], OWNERS)
    rb, journal = runbooks(coord)
    before = await coord.revision()
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    assert [(m.from_region, m.to_region) for m in plan.moves] == [("eu-west", "eu-central")]
    await rb.plan_drain("eu-west")
    await rb.plan_failover("eu-west", to=None, force=True)
    assert await coord.revision() == before
    assert journal.since(None) == []


async def test_switchover_moves_and_journals_with_reason_and_actor(coord: EtcdCoordination) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    rb, journal = runbooks(coord)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    result = await rb.run_switchover(plan.moves[0], reason="rebalance", timeout_s=5)
    owner = await Ownership(coord).get("ckpt/a")
    assert owner is not None and owner.region == "eu-central" and owner.epoch == result.epoch
    assert owner.handing_over_to is None
    [entry] = journal.since(None)
    assert (entry.kind, entry.reason, entry.actor, entry.epoch) == (
        "switchover",
        "rebalance",
        "op@host",
        result.epoch,
    )
    assert entry.epoch > plan.moves[0].epoch_before


async def test_switchover_aborted_on_timeout_restores_the_previous_owner(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    before = await Ownership(coord).get("ckpt/a")
    assert before is not None
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    with pytest.raises(SwitchoverAbortedError, match="1 version"):
        await rb.run_switchover(plan.moves[0], reason="t", timeout_s=0.5)
    after = await Ownership(coord).get("ckpt/a")
    assert after == before  # same owner, same epoch, no handover mark left
    [entry] = journal.since(None)
    assert entry.outcome == "aborted" and entry.epoch == before.epoch
    # No move happened: the row says so in the fields every output format shows.
    assert (entry.from_region, entry.to_region, entry.completed_at) == ("eu-west", "eu-west", None)
    assert entry.reason.startswith("aborted: switchover to eu-central not done")
    assert entry.details["intended_to"] == "eu-central"


async def test_switchover_waits_for_the_target_to_catch_up(coord: EtcdCoordination) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, _ = runbooks(coord, probe)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    task = asyncio.create_task(rb.run_switchover(plan.moves[0], reason="t", timeout_s=5))
    assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
    frozen = await Ownership(coord).get("ckpt/a")
    assert frozen is not None and frozen.region == "eu-west"
    assert frozen.handing_over_to == "eu-central"  # writes are frozen meanwhile
    probe.missing.clear()
    result = await asyncio.wait_for(task, 5)
    assert result.move.to_region == "eu-central"


async def test_bad_targets_are_refused_with_their_reason(coord: EtcdCoordination) -> None:
    await seed(coord, ["eu-west", "eu-central", "us-east"], OWNERS)
    rb, _ = runbooks(coord)
    with pytest.raises(RefusedError, match="residency: jurisdiction US"):
        await rb.plan_switchover("ckpt/a", "us-east")
    with pytest.raises(RefusedError, match="dead"):
        await rb.plan_switchover("ckpt/a", "eu-north")
    with pytest.raises(NotFoundError, match="unknown dataset 'ckpt/zz'"):
        await rb.plan_switchover("ckpt/zz", "eu-central")
    with pytest.raises(NotFoundError, match="unknown target region 'mars'"):
        await rb.plan_switchover("ckpt/a", "mars")


async def test_failover_refuses_a_live_source_and_names_rejected_candidates(
    coord: EtcdCoordination,
) -> None:
    lease = await seed(coord, ["eu-west", "eu-central", "us-east"], OWNERS)
    rb, journal = runbooks(coord)
    with pytest.raises(RefusedError, match="still alive"):
        await rb.plan_failover("eu-west", to=None, force=False)
    await coord.delete(keys.alive("eu-west"))
    plan, ctx = await rb.plan_failover("eu-west", to=None, force=False)
    assert {(m.dataset, m.to_region) for m in plan.moves} == {("ckpt/a", "eu-central")}
    reasons = {(r.dataset, r.region): r.reason for r in plan.rejected}
    assert reasons[("ckpt/b", "us-east")].startswith("residency")
    assert reasons[("ckpt/b", "eu-north")].startswith("dead")
    assert reasons[("ckpt/m", "eu-central")].startswith("manual mode")
    assert reasons[("ckpt/m", "eu-north")].startswith("manual mode")
    results = await rb.run_failover(plan, ctx, reason="region on fire", force=False)
    assert [r.move.dataset for r in results] == ["ckpt/a"]
    [entry] = journal.since(None)
    assert (entry.kind, entry.reason, entry.from_region, entry.to_region) == (
        "failover",
        "region on fire",
        "eu-west",
        "eu-central",
    )
    with pytest.raises(RefusedError, match="residency"):
        await rb.plan_failover("eu-west", to="us-east", force=False)
    await coord.revoke(lease)


async def test_drain_moves_everything_and_stops_ownership(coord: EtcdCoordination) -> None:
    await seed(
        coord, ["eu-west", "eu-central", "eu-north"], {"ckpt/a": "eu-west", "ckpt/b": "eu-west"}
    )
    rb, journal = runbooks(coord)
    plan, _ = await rb.plan_drain("eu-west")
    assert {(m.dataset, m.to_region) for m in plan.moves} == {
        ("ckpt/a", "eu-central"),
        ("ckpt/b", "eu-north"),
    }
    _, failed = await rb.run_drain("eu-west", plan, reason="maintenance", timeout_s=5)
    assert failed == []
    owners = await Ownership(coord).list()
    assert {o.region for o in owners.values()} == {"eu-central", "eu-north"}
    kv = await coord.get(keys.state("eu-west"))
    assert kv is not None and kv.value == b"draining"
    assert {e.kind for e in journal.since(None)} == {"drain"}
    with pytest.raises(RefusedError, match="draining"):
        await rb.plan_switchover("ckpt/a", "eu-west")
    await rb.undrain("eu-west")
    assert await coord.get(keys.state("eu-west")) is None


async def test_a_retired_datasets_owner_record_does_not_stop_a_drain(
    coord: EtcdCoordination,
) -> None:
    # ckpt/old was critical once; no applied policy places it now, and its owner record
    # stays in etcd. A drain (and a failover --to) must not refuse over it.
    await seed(
        coord, ["eu-west", "eu-central", "eu-north"], {"ckpt/a": "eu-west", "ckpt/old": "eu-west"}
    )
    rb, _ = runbooks(coord)
    plan, _ = await rb.plan_drain("eu-west")
    assert plan.unmoved == [] and [u.dataset for u in plan.retired] == ["ckpt/old"]
    results, failed = await rb.run_drain("eu-west", plan, reason="m", timeout_s=5)
    assert [r.move.dataset for r in results] == ["ckpt/a"] and failed == []
    assert await rb.left_behind("eu-west", plan, failed) == []
    # eu-west now owns only ckpt/old: a failover naming a target is not refused over it.
    failover, _ = await rb.plan_failover("eu-west", to="eu-north", force=True)
    assert failover.moves == [] and failover.unmoved == []
    assert [u.dataset for u in failover.retired] == ["ckpt/old"]


async def test_drain_moves_what_it_can_when_one_switchover_aborts(
    coord: EtcdCoordination,
) -> None:
    await seed(
        coord, ["eu-west", "eu-central", "eu-north"], {"ckpt/a": "eu-west", "ckpt/b": "eu-west"}
    )
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]  # ckpt/a's target lags behind
    rb, journal = runbooks(coord, probe)
    plan, _ = await rb.plan_drain("eu-west")
    results, failed = await rb.run_drain("eu-west", plan, reason="m", timeout_s=0.3)
    assert [r.move.dataset for r in results] == ["ckpt/b"]  # moved although ckpt/a aborted
    assert [u.dataset for u in failed] == ["ckpt/a"] and "aborted" in failed[0].reason
    [left] = await rb.left_behind("eu-west", plan, failed)
    assert left.dataset == "ckpt/a" and "1 version(s) were still incomplete" in left.reason
    assert sorted(e.outcome for e in journal.since(None)) == ["aborted", "moved"]


async def test_drain_moves_the_others_when_one_meets_an_error_on_the_way(
    coord: EtcdCoordination,
) -> None:
    # runbooks.md: a drain "still moves the others, then exits 1 naming what it left
    # behind", also when a move fails on an error (here: its catch-up probe).
    await seed(
        coord, ["eu-west", "eu-central", "eu-north"], {"ckpt/a": "eu-west", "ckpt/b": "eu-west"}
    )

    class FailingForA(MemoryCatchUp):
        def incomplete_versions(self, dataset: str, region: str) -> list[str]:
            if dataset == "ckpt/a":
                raise UnavailableError("the target's agent did not answer (test fault)")
            return super().incomplete_versions(dataset, region)

    rb, _ = runbooks(coord, FailingForA())
    plan, _ = await rb.plan_drain("eu-west")
    results, failed = await rb.run_drain("eu-west", plan, reason="m", timeout_s=2)
    assert [r.move.dataset for r in results] == ["ckpt/b"]
    assert [(u.dataset, "did not answer" in u.reason) for u in failed] == [("ckpt/a", True)]


async def test_switchover_does_not_hand_over_to_a_target_that_died_while_catching_up(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-west"], OWNERS)
    target_lease = await coord.grant(60)
    await coord.put(keys.alive("eu-central"), b"{}", lease=target_lease.id)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    before = await Ownership(coord).get("ckpt/a")
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")

    async def target_dies_then_catches_up() -> None:
        assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)  # the runbook waits
        await coord.revoke(target_lease.id)  # eu-central's controller is gone
        probe.missing.clear()  # ...after it had caught up

    killer = asyncio.create_task(target_dies_then_catches_up())
    with pytest.raises(ConflictError):
        await rb.run_switchover(plan.moves[0], reason="t", timeout_s=5)
    await killer
    assert await Ownership(coord).get("ckpt/a") == before  # still eu-west, same epoch
    [entry] = journal.since(None)
    assert (entry.outcome, entry.to_region) == ("aborted", "eu-west")


async def test_switchover_does_not_hand_over_to_a_target_drained_while_catching_up(
    coord: EtcdCoordination,
) -> None:
    # An operator drains eu-central (runbooks.md: pause, then drain) while this
    # switchover waits for it: the commit's guard on its state refuses the move.
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    before = await Ownership(coord).get("ckpt/a")
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")

    async def target_drained_then_caught_up() -> None:
        assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
        await set_region_state(coord, "eu-central", RegionState.DRAINING)
        probe.missing.clear()

    drainer = asyncio.create_task(target_drained_then_caught_up())
    with pytest.raises(ConflictError):
        await rb.run_switchover(plan.moves[0], reason="t", timeout_s=5)
    await drainer
    assert await Ownership(coord).get("ckpt/a") == before  # still eu-west, same epoch
    [entry] = journal.since(None)
    assert (entry.outcome, entry.to_region) == ("aborted", "eu-west")


async def test_switchover_to_a_target_drained_after_the_plan_is_refused_at_once(
    coord: EtcdCoordination,
) -> None:
    # Drained while the operator looked at the plan (before confirming).
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    rb, journal = runbooks(coord)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    await set_region_state(coord, "eu-central", RegionState.FENCED)
    with pytest.raises(ConflictError, match="eu-central is fenced since the plan was made"):
        await rb.run_switchover(plan.moves[0], reason="t", timeout_s=5)
    owner = await Ownership(coord).get("ckpt/a")
    assert owner is not None and owner.region == "eu-west" and owner.handing_over_to is None
    assert journal.since(None) == []


async def test_a_committed_switchover_is_reported_moved_while_the_catalog_is_away(
    coord: EtcdCoordination,
) -> None:
    # etcd has the new owner: a journal that does not answer must not turn the move into
    # a failure (a drain would stop there); the new owner's controller journals it.
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    rb, journal = runbooks(coord)

    def away(entry: JournalEntry) -> None:
        raise CatalogUnavailableError("the catalog did not answer (test fault)")

    journal.append = away  # type: ignore[method-assign]
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    result = await rb.run_switchover(plan.moves[0], reason="t", timeout_s=5)
    owner = await Ownership(coord).get("ckpt/a")
    assert owner is not None and (owner.region, owner.epoch) == ("eu-central", result.epoch)
    assert result.move.to_region == "eu-central"


async def test_switchover_that_committed_behind_an_error_is_journaled_as_moved(
    coord: EtcdCoordination, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handover transaction commits but its answer is lost (a timeout): the
    runbook finds the target owning the dataset and journals the move, not an abort."""
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    rb, journal = runbooks(coord)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    complete = rb.ownership.complete_handover

    async def committed_then_timed_out(*args: Any, **kwargs: Any) -> int:
        await complete(*args, **kwargs)
        raise OperationTimeoutError("etcd did not answer in time")

    monkeypatch.setattr(rb.ownership, "complete_handover", committed_then_timed_out)
    result = await rb.run_switchover(plan.moves[0], reason="t", timeout_s=1)
    now = await Ownership(coord).get("ckpt/a")
    assert now is not None and (now.region, now.epoch) == ("eu-central", result.epoch)
    [entry] = journal.since(None)
    assert (entry.outcome, entry.to_region, entry.epoch) == ("moved", "eu-central", now.epoch)


async def test_an_automatic_failover_during_a_switchover_is_not_journaled_as_it(
    coord: EtcdCoordination,
) -> None:
    """While the switchover waits for its target, the owner region's controller dies
    and an automatic failover moves the dataset to the same target: the runbook does
    not journal that move as its own switchover (kind, actor, reason and RPO would be
    the operator's), and it says who moved it."""
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    task = asyncio.create_task(rb.run_switchover(plan.moves[0], reason="op's", timeout_s=2))
    assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
    controllers = MemoryJournal()
    failover = await apply_move(
        Ownership(coord),
        plan.moves[0],
        guards=[],
        kind="automatic",
        reason="eu-west lost its lease",
        actor="controller@eu-central",
        journal=controllers,
        probe=None,
        detected_at=None,
    )
    assert failover is not None
    with pytest.raises(ConflictError, match="automatic by controller@eu-central"):
        await asyncio.wait_for(task, 10)
    [aborted] = journal.since(None)
    assert aborted.outcome == "aborted"
    assert "automatic by controller@eu-central moved it to eu-central" in aborted.reason
    [moved] = controllers.since(None)
    assert (moved.kind, moved.epoch) == ("automatic", failover.epoch)


class SlowJournal(MemoryJournal):
    """Appends take a while, so that the caller can be cancelled mid-write."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = threading.Event()
        self.loop = asyncio.get_running_loop()

    def append(self, entry: JournalEntry) -> None:
        self.loop.call_soon_threadsafe(self.started.set)
        self.release.wait(10)  # until the test has seen the caller leave mid-write
        super().append(entry)


async def test_a_cancelled_move_still_writes_its_journal_row(coord: EtcdCoordination) -> None:
    """A controller stopping (SIGTERM) cancels its failover; a move whose transaction
    committed must still get its row, and stopping waits for it."""
    await seed(coord, ["eu-west", "eu-central"], {"ckpt/a": "eu-west"})
    journal = SlowJournal()
    owner = await Ownership(coord).get("ckpt/a")
    assert owner is not None
    move = Move("ckpt/a", "eu-west", "eu-central", owner.epoch)
    moves = MoveTracker()
    caller = asyncio.create_task(
        moves.run(
            apply_move(
                Ownership(coord),
                move,
                guards=[],
                kind="failover",
                reason="test",
                actor="op@host",
                journal=journal,
                probe=None,
                detected_at=None,
            )
        )
    )
    await asyncio.wait_for(journal.started.wait(), 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert journal.entries == {}  # the write is still running...
    journal.release.set()
    assert await moves.finish(timeout_s=10) == 0
    (entry,) = journal.entries.values()  # ...and it landed
    assert (entry.dataset, entry.from_region, entry.to_region) == (
        "ckpt/a",
        "eu-west",
        "eu-central",
    )
    now = await Ownership(coord).get("ckpt/a")
    assert now is not None and now.region == "eu-central"


async def _marked(coord: EtcdCoordination, dataset: str) -> bool:
    return await coord.get(keys.handover(dataset)) is not None


async def _writable(resource: FencedResource, dataset: str, epoch: int) -> bool:
    try:
        resource.admit(dataset, epoch)
    except DatasetHandingOverError:
        return False
    return True


async def test_a_dead_runbooks_handover_mark_goes_with_its_lease(coord: EtcdCoordination) -> None:
    """The runbook stops renewing (as if SIGKILLed): etcd deletes its mark when the lease
    lapses, and the old owner's writes at the same epoch are admitted again."""
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]  # the runbook waits
    rb, journal = runbooks(coord, probe)
    rb.lease_ttl_s = 2
    before = await Ownership(coord).get("ckpt/a")
    assert before is not None
    resource = FencedResource()
    ready = asyncio.Event()
    follower = asyncio.create_task(follow_ownership(coord, resource, ready))
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    task = asyncio.create_task(rb.run_switchover(plan.moves[0], reason="t", timeout_s=60))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
        mark = await rb.ownership.handover("ckpt/a")
        assert mark is not None and mark.lease != 0 and mark.deadline
        assert await wait_until(lambda: _not(_writable(resource, "ckpt/a", before.epoch)), 5)
        assert rb._keepalive is not None
        await rb._keepalive.stop()  # the runbook's process is gone: nobody renews
        died = time.monotonic()
        # Within the 2 s lease and etcd's expiry pass, with room for a loaded 3-member
        # cluster; the runbook's own deadline (60 s) is far beyond, so only the lapse fits.
        assert await wait_until(lambda: _writable(resource, "ckpt/a", before.epoch), 2 + 8)
        assert time.monotonic() - died <= 2 + 8
        assert await Ownership(coord).get("ckpt/a") == before  # same owner, same epoch
        # Were the runbook only paused, its move could not commit on the lapsed mark.
        probe.missing.clear()
        with pytest.raises(ConflictError):
            await asyncio.wait_for(task, 10)
        assert await Ownership(coord).get("ckpt/a") == before
        [entry] = journal.since(None)
        assert entry.outcome == "aborted" and "its handover mark was already gone" in entry.reason
    finally:
        task.cancel()
        follower.cancel()
        await asyncio.gather(task, follower, return_exceptions=True)
        await rb.close()


async def _not(cond: Any) -> bool:
    return not await cond


async def test_abort_ends_a_half_done_switchover_and_journals_it_once(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    before = await Ownership(coord).get("ckpt/a")
    with pytest.raises(RefusedError, match="no switchover of ckpt/a is in progress"):
        await rb.plan_abort_switchover("ckpt/a")
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    task = asyncio.create_task(rb.run_switchover(plan.moves[0], reason="t", timeout_s=60))
    try:
        assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
        operator, _ = runbooks(coord)
        operator.journal = journal
        operator.actor = "oncall@host"
        mark = await operator.plan_abort_switchover("ckpt/a")
        assert (mark.from_region, mark.to_region, mark.kind) == (
            "eu-west",
            "eu-central",
            "switchover",
        )
        entry = await operator.abort_switchover(mark, reason="stuck")
        assert not await _marked(coord, "ckpt/a")
        assert await Ownership(coord).get("ckpt/a") == before
        assert entry.outcome == "aborted" and entry.actor == "oncall@host"
        assert entry.reason.startswith("aborted: switchover to eu-central not done, ended by")
        with pytest.raises(ConflictError):  # a second abort finds the mark gone
            await operator.abort_switchover(mark, reason="again")
        probe.missing.clear()  # the runbook's move now fails: its mark is gone
        with pytest.raises(ConflictError):
            await asyncio.wait_for(task, 10)
        assert [e.id for e in journal.since(None)] == [entry.id]  # one row, not two
        assert await Ownership(coord).get("ckpt/a") == before
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await rb.close()


async def test_a_runbook_whose_lease_is_lost_gives_up_and_restores_the_owner(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = MemoryCatchUp()
    probe.missing[("ckpt/a", "eu-central")] = ["obj@v9"]
    rb, journal = runbooks(coord, probe)
    before = await Ownership(coord).get("ckpt/a")
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    task = asyncio.create_task(rb.run_switchover(plan.moves[0], reason="t", timeout_s=60))
    try:
        assert await wait_until(lambda: _marked(coord, "ckpt/a"), 5)
        mark = await rb.ownership.handover("ckpt/a")
        assert mark is not None
        await coord.revoke(mark.lease)  # etcd lost it (an outage longer than the TTL)
        with pytest.raises(SwitchoverAbortedError, match="lease on etcd lapsed"):
            await asyncio.wait_for(task, 10)
        assert await Ownership(coord).get("ckpt/a") == before
        [entry] = journal.since(None)
        assert entry.outcome == "aborted" and "lease lapsed" in entry.reason
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await rb.close()


class DownPlacements:
    """Test scaffolding: a catalog that is down for every read."""

    def regions(self) -> list[Any]:
        raise CatalogUnavailableError("the catalog at test:// is down")

    def placements(self) -> list[Any]:
        raise CatalogUnavailableError("the catalog at test:// is down")


async def test_a_failover_plans_from_the_policy_in_etcd_while_the_catalog_is_down(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-central", "eu-north", "us-east"], OWNERS)
    world = MemoryPlacements(REGIONS, [critical("ckpt/a"), critical("ckpt/b", order=("eu-north",))])
    await publish_world(coord, world)
    # A dataset first seen after the apply is planned too, placed by the rules; these
    # test rules place nothing, so it is announced and left alone (nothing governs it).
    await announce(coord, "ckpt/unplaced", by="eu-west/a1")
    rb = Runbooks(coord, DownPlacements(), MemoryJournal(), MemoryCatchUp(), actor="op@host")
    plan, _ = await rb.plan_failover("eu-west", to=None, force=False)
    assert sorted((m.dataset, m.to_region) for m in plan.moves) == [
        ("ckpt/a", "eu-central"),
        ("ckpt/b", "eu-north"),
    ]
    # With nothing published, the catalog is the only source left: its outage shows.
    await coord.delete(keys.POLICY_CURRENT)
    with pytest.raises(CatalogUnavailableError):
        await rb.plan_failover("eu-west", to=None, force=False)


class _Blind:
    """A probe that cannot compare the agents (as when etcd or an agent is away)."""

    def __init__(self) -> None:
        self.asked = 0

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        self.asked += 1
        return [f"(agents of {dataset} cannot be compared: etcd is unreachable)"]


async def test_a_switchover_whose_catch_up_cannot_be_checked_asks_ever_more_slowly(
    coord: EtcdCoordination,
) -> None:
    await seed(coord, ["eu-west", "eu-central"], OWNERS)
    probe = _Blind()
    rb, journal = runbooks(coord, probe)
    plan, _ = await rb.plan_switchover("ckpt/a", "eu-central")
    with pytest.raises(SwitchoverAbortedError, match="could not be checked for 2 s") as info:
        await rb.run_switchover(plan.moves[0], reason="t", timeout_s=2)
    assert "etcd is unreachable" in str(info.value)
    # 0.1 + 0.2 + 0.4 + 0.8 + 0.5: six asks in 2 s, where polling every 50 ms asks 40.
    assert probe.asked <= 8, probe.asked
    [entry] = journal.since(None)
    assert entry.outcome == "aborted"
