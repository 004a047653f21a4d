"""The region controller through its in-process API, against real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from harness.invariants import epoch_violations, split_brain
from prometheus_client import generate_latest

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.claims import term_guards
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.coordination.catalog_glue.sources import JournalEntry, journal_id
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import DirectoryEpochs
from controlplane.coordination.protocols.ownership import MoveFacts, Ownership
from controlplane.coordination.protocols.view import read_view
from controlplane.coordination.timeutil import utcnow
from controlplane.errors import NotFoundError
from controlplane.stack.etcd import EtcdCluster

from .helpers import publish_world, wait_until
from .lossy import AnswersLost

pytestmark = pytest.mark.integration

World = tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]


@contextlib.asynccontextmanager
async def controller(
    etcd3: EtcdCluster,
    world: World,
    region: str,
    fence_dir: Path | None = None,
    ttl: int = 2,
    controller_id: str | None = None,
    adapter: type[EtcdCoordination] = EtcdCoordination,
) -> AsyncIterator[RegionController]:
    coord = adapter(etcd3.endpoints, timeout_s=3)
    await coord.connect()
    source, journal, probe = world
    await publish_world(coord, source)
    ctl = RegionController(
        coord,
        journal,
        probe,
        ControllerConfig(
            region=region,
            controller_id=controller_id or f"{region}-t",
            lease_ttl_s=ttl,
            fence_dir=fence_dir,
        ),
    )
    try:
        async with ctl:
            yield ctl
    finally:
        await coord.close()


async def test_home_claims_then_failover_moves_every_automatic_dataset(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World, fence_dir: Path
) -> None:
    own = Ownership(coord)
    samples: list[dict[str, tuple[str, int]]] = []
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        for _ in range(2000):
            if stop_sampling.is_set():
                return
            owners = await own.list()
            samples.append({d: (o.region, o.epoch) for d, o in owners.items()})
            await asyncio.sleep(0.02)  # the sampling period, not a wait for anything

    sampler = asyncio.create_task(sample())
    # Two live racers (eu-central, eu-north) for every move: exactly one wins each.
    async with (
        controller(etcd3, world, "eu-central", fence_dir) as central,
        controller(etcd3, world, "eu-north", fence_dir) as north,
    ):
        async with controller(etcd3, world, "eu-west", fence_dir) as west:
            assert await wait_until(lambda: _owned(own, "eu-west", 6), 10)
            assert await wait_until(lambda: _true(len(west.owned) == 6), 5)
            assert await wait_until(lambda: _accepted(fence_dir, "eu-west"), 5)  # canaries flow
            exposition = generate_latest(west.metrics.registry).decode()
            assert "meridian_controller_active 1.0" in exposition
            assert "meridian_controller_datasets_owned 6.0" in exposition
            assert "meridian_controller_claims_total 6.0" in exposition
        # eu-west stopped: its lease is revoked, eu-central takes the automatic ones.
        assert await wait_until(lambda: _owned(own, "eu-central", 5), 10)
        assert await wait_until(lambda: _true(len(central.owned) == 5), 5)

        async def won(count: int) -> bool:
            return sum(_counter(c, "meridian_controller_failovers_total") for c in racers) == count

        racers = (central, north)
        assert await wait_until(lambda: won(5), 5)
        manual = await own.get("ckpt/manual")
        assert manual is not None and manual.region == "eu-west"
    assert await wait_until(lambda: _true(len(samples) > 20), 5)  # enough to judge by
    stop_sampling.set()
    await sampler
    assert epoch_violations(samples) == []
    assert split_brain(DirectoryEpochs(fence_dir).read_log()) == []
    _, journal, _ = world
    entries = journal.since(None)
    assert sorted(e.dataset for e in entries) == [f"ckpt/m{i}" for i in range(5)]
    for e in entries:
        assert (e.from_region, e.to_region, e.reason, e.kind) == (
            "eu-west",
            "eu-central",
            "lease expired",
            "automatic",
        )
        assert e.actor.startswith(("controller eu-central/", "controller eu-north/"))
        assert e.detected_at is not None and e.completed_at is not None
        assert e.epoch > e.details["epoch_before"]  # type: ignore[operator]


async def test_pause_stops_automatic_failover(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    own = Ownership(coord)
    async with controller(etcd3, world, "eu-central"):
        async with controller(etcd3, world, "eu-west"):
            assert await wait_until(lambda: _owned(own, "eu-west", 6), 10)
            await coord.put("/meridian/maintenance", b"{}")
        # Not a synchronisation: the window (two TTLs and more) in which eu-central
        # would fail eu-west over if the pause did not hold.
        await asyncio.sleep(4)
        owners = await own.list()
        assert {o.region for o in owners.values()} == {"eu-west"}


async def test_two_controllers_of_one_region_elect_one_active(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    async with controller(etcd3, world, "eu-west") as a, controller(etcd3, world, "eu-west") as b:
        assert await wait_until(lambda: _true(a.active.is_set() or b.active.is_set()), 5)
        await asyncio.sleep(0.5)  # a window in which a second activation would show
        assert a.active.is_set() != b.active.is_set()
        first, second = (a, b) if a.active.is_set() else (b, a)
        await first.stop()
        assert await wait_until(lambda: _true(second.active.is_set()), 5)
        view = await read_view(coord)
        assert view.is_alive("eu-west")


async def test_a_standby_takes_over_from_a_controller_whose_term_ended_by_its_own_count(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    """The active controller counts its lease lost while etcd keeps it (its renewals'
    answers lost for a TTL, as in a short one-way partition or a stall, while the test
    keeps the lease alive in etcd). Back, it queues behind the standby rather
    than take its place up again: a controller that does this again and again must not
    keep a healthy standby out for good. The liveness key never vanishes meanwhile (no
    region may read a death), and the standby's term defers failovers as one that
    follows an outage does."""
    alive = keys.alive("eu-west")
    async with controller(
        etcd3, world, "eu-west", controller_id="west-a", adapter=AnswersLost
    ) as a:
        assert await wait_until(lambda: _true(a.active.is_set()), 10)
        a_term = a.ctx.term
        assert a_term is not None and not a_term.took_over  # a cold start
        async with controller(etcd3, world, "eu-west", controller_id="west-b") as b:
            assert await wait_until(lambda: _queued(coord, 2), 10)  # b waits behind a
            held = await coord.get(alive)
            assert held is not None
            lossy = a.ctx.coord
            assert isinstance(lossy, AnswersLost)

            async def etcd_keeps_it() -> None:
                while True:
                    await coord.refresh(held.lease)
                    await asyncio.sleep(0.3)

            keeper = asyncio.create_task(etcd_keeps_it())
            lossy.cut = True
            try:  # a TTL of lost answers: a steps down
                assert await wait_until(lambda: _true(not a.active.is_set()), 15)
                lossy.cut = False
                assert await wait_until(lambda: _true(b.active.is_set()), 15)
            finally:
                lossy.cut = False
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
            assert not a.active.is_set()
            kv = await coord.get(alive)
            assert kv is not None and json.loads(kv.value)["controller"] == "west-b"
            # Never deleted meanwhile: a key made anew has a new create revision.
            assert kv.create_revision == held.create_revision and kv.lease != held.lease
            failover = b._failover
            assert failover is not None and failover.recovering
            # A claim of a's ended term (in flight as it ended) no longer passes.
            assert b.ctx.term is not None
            assert (await coord.txn(term_guards("eu-west", b.ctx.term), [])).succeeded
            assert not (await coord.txn(term_guards("eu-west", a_term), [])).succeeded
            await asyncio.sleep(1)  # a window in which a's taking its term back would show
            assert b.active.is_set() and not a.active.is_set()
        # b stops for good (its lease revoked): a, next in line, takes over.
        assert await wait_until(lambda: _true(a.active.is_set()), 10)


async def _queued(coord: EtcdCoordination, n: int) -> bool:
    kvs, _ = await coord.get_prefix(keys.election("eu-west"))
    return len(kvs) == n


async def test_unknown_region_is_refused_at_start(etcd3: EtcdCluster, world: World) -> None:
    with pytest.raises(NotFoundError, match="not in the applied topology"):
        async with controller(etcd3, world, "mars-1"):
            pass


async def _owned(own: Ownership, region: str, n: int) -> bool:
    owners = await own.list()
    return sum(1 for o in owners.values() if o.region == region) == n


async def _true(value: bool) -> bool:
    return value


def _counter(ctl: RegionController, name: str) -> float:
    value = ctl.metrics.registry.get_sample_value(name)
    return float(value or 0.0)


async def test_a_move_whose_journal_row_was_lost_is_journaled_by_the_new_owner(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    """A mover that crashed between its ownership win and its journal row: the new
    owner's controller rebuilds the row (same id), after a grace period, once."""
    source, journal, probe = world
    own = Ownership(coord)
    facts = MoveFacts("automatic", "eu-west")
    lost = await own.claim(
        "ckpt/m0", "eu-central", expect_epoch=0, reason="lease expired", actor="ctl-x", move=facts
    )
    kept = await own.claim(
        "ckpt/m1", "eu-central", expect_epoch=0, reason="lease expired", actor="ctl-x", move=facts
    )
    written = JournalEntry(
        id=journal_id("ckpt/m1", kept),
        dataset="ckpt/m1",
        from_region="eu-west",
        to_region="eu-central",
        epoch=kept,
        kind="automatic",
        reason="lease expired",
        actor="ctl-x",
        detected_at=None,
        started_at=utcnow(),
        completed_at=utcnow(),
        rpo_versions=3,
    )
    journal.append(written)
    await own.claim("ckpt/m2", "eu-central", expect_epoch=0, reason="first claim", actor="t")
    config = ControllerConfig(
        region="eu-central",
        controller_id="eu-central-t",
        lease_ttl_s=2,
        journal_grace_s=600.0,  # the test ages rows through `now`, without sleeping
        journal_check_interval_s=1000,  # only the test's calls after the first one
    )
    await publish_world(coord, source)
    async with (
        EtcdCoordination(etcd3.endpoints, timeout_s=3) as c,
        RegionController(c, journal, probe, config) as ctl,
    ):
        assert await wait_until(lambda: _true(ctl.active.is_set()), 5)
        assert await ctl.backfill_journal(force=True) == 0  # within the grace period
        assert journal.missing([journal_id("ckpt/m0", lost)]) == {f"ckpt/m0@{lost}"}
        later = time.monotonic() + 601
        assert await ctl.backfill_journal(force=True, now=later) == 1
        assert await ctl.backfill_journal(force=True, now=later + 601) == 0  # none missing
    rows = {e.dataset: e for e in journal.since(None)}
    assert set(rows) == {"ckpt/m0", "ckpt/m1"}  # a first claim is not a move
    assert rows["ckpt/m1"] == written  # a row written by its mover is never replaced
    row = rows["ckpt/m0"]
    assert (row.id, row.from_region, row.to_region, row.epoch, row.kind, row.actor) == (
        f"ckpt/m0@{lost}",
        "eu-west",
        "eu-central",
        lost,
        "automatic",
        "ctl-x",
    )
    assert row.reason.startswith("lease expired (journaled late by controller eu-central/")
    assert row.details["backfilled"] is True and row.details["epoch_before"] == 0


async def test_a_lost_move_displaced_by_a_later_one_is_journaled_too(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    """A switchover's runbook died before its row, and the dataset failed over again
    within the grace: the owner record no longer names the first move, but etcd's
    history does. The new owner's controller rebuilds that row too, once; a first
    claim displaced is no move, and a row its mover wrote is never replaced."""
    source, journal, probe = world
    own = Ownership(coord)
    home = await own.claim("ckpt/m5", "eu-west", expect_epoch=0, reason="first", actor="t")
    lost = await own.claim(
        "ckpt/m5",
        "eu-north",
        expect_epoch=home,
        reason="planned",
        actor="runbook-x",
        move=MoveFacts("switchover", "eu-west"),
    )
    last = await own.claim(
        "ckpt/m5",
        "eu-central",
        expect_epoch=lost,
        reason="lease expired",
        actor="ctl-y",
        move=MoveFacts("automatic", "eu-north"),
    )
    first = await own.claim(
        "ckpt/m6",
        "eu-central",
        expect_epoch=0,
        reason="lease expired",
        actor="ctl-y",
        move=MoveFacts("automatic", "eu-west"),
    )
    written = [
        JournalEntry(
            id=journal_id(dataset, epoch),
            dataset=dataset,
            from_region=frm,
            to_region="eu-central",
            epoch=epoch,
            kind="automatic",
            reason="lease expired",
            actor="ctl-y",
            detected_at=None,
            started_at=utcnow(),
            completed_at=utcnow(),
            rpo_versions=0,
        )
        for dataset, epoch, frm in (("ckpt/m5", last, "eu-north"), ("ckpt/m6", first, "eu-west"))
    ]
    for entry in written:
        journal.append(entry)
    config = ControllerConfig(
        region="eu-central",
        controller_id="eu-central-t",
        lease_ttl_s=2,
        journal_grace_s=600.0,
        journal_check_interval_s=1000,
    )
    await publish_world(coord, source)
    async with (
        EtcdCoordination(etcd3.endpoints, timeout_s=3) as c,
        RegionController(c, journal, probe, config) as ctl,
    ):
        assert await wait_until(lambda: _true(ctl.active.is_set()), 5)
        assert await ctl.backfill_journal(force=True) == 0  # within the grace period
        later = time.monotonic() + 601
        assert await ctl.backfill_journal(force=True, now=later) == 1
        assert await ctl.backfill_journal(force=True, now=later + 601) == 0
    rows = {e.id: e for e in journal.since(None)}
    assert set(rows) == {e.id for e in written} | {journal_id("ckpt/m5", lost)}
    assert [rows[e.id] for e in written] == written
    row = rows[journal_id("ckpt/m5", lost)]
    assert (row.from_region, row.to_region, row.epoch, row.kind, row.actor) == (
        "eu-west",
        "eu-north",
        lost,
        "switchover",
        "runbook-x",
    )
    assert row.details["backfilled"] is True and row.details["epoch_before"] == home


def test_journal_ids_fit_the_catalog_column_and_stay_unique() -> None:
    assert journal_id("ckpt/a", 42) == "ckpt/a@42"
    long_a, long_b = "x" * 200 + "a", "x" * 200 + "b"
    ids = {journal_id(n, 123456789, "-abort-123456790") for n in (long_a, long_b)}
    assert len(ids) == 2 and all(len(i) <= 64 for i in ids)
    assert all(i.endswith("@123456789-abort-123456790") for i in ids)


async def _accepted(fence: Path, region: str) -> bool:
    """A canary write of `region`'s controller has been accepted by the fence."""
    return any(r["region"] == region and r["accepted"] for r in DirectoryEpochs(fence).read_log())
