"""`EtcdOwners`: owner records read from etcd with a bounded age, combined with the
daemon's watched map; the fake coordination port for units, real etcd for the
integration test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    REGION,
    REGIONS,
    put,
    refusal,
    start_agent,
    stop_agent,
    world,
)
from fakes.admission import StaticPolicy, compiled
from fakes.coordination import MemoryCoordination

from agents.admission import Admission, OwnerRecord
from agents.daemon.owners import OwnershipWatch
from agents.errors import NotOwnerError
from agents.metrics import AgentMetrics
from agents.owners import EtcdOwners
from agents.rpc.status import from_rpc_error
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.ownership import Owner, Ownership
from controlplane.errors import UnavailableError
from controlplane.loopback import free_block
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission_in(region: str, fence: FencedResource, owners: EtcdOwners) -> Admission:
    policy = StaticPolicy(compiled(REGIONS, world()))
    return Admission(region, policy, fence, owners, AgentMetrics(region))


async def test_a_read_feeds_the_fence_and_an_unowned_dataset_is_none() -> None:
    coord = MemoryCoordination()
    epoch = await Ownership(coord).claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    owners = EtcdOwners(coord, fence)
    assert await owners.owner(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, False)
    assert owners.known(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, False)
    assert fence.highest_epoch(CRITICAL) == epoch
    assert await owners.owner("unowned/ds") is None


async def test_a_read_older_than_the_bound_is_redone_and_etcd_down_fails_closed() -> None:
    coord = MemoryCoordination()
    await Ownership(coord).claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    clock = Clock()
    owners = EtcdOwners(coord, FencedResource(), max_age_s=0.5, clock=clock)
    first = await owners.owner(CRITICAL)
    coord.set_unavailable(True)
    clock.now += 0.4
    assert await owners.owner(CRITICAL) == first  # within the bound: the read is reused
    clock.now += 0.2
    with pytest.raises(UnavailableError, match="cannot be read from etcd"):
        await owners.owner(CRITICAL)
    coord.set_unavailable(False)
    assert await owners.owner(CRITICAL) == first


async def test_a_mark_the_watch_delivered_after_the_read_is_used_at_once() -> None:
    coord = MemoryCoordination()
    ownership = Ownership(coord)
    epoch = await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    async with OwnershipWatch(coord, fence, retry_initial_s=0.05) as watch:
        owners = EtcdOwners(coord, fence, watched=watch, max_age_s=60)
        assert await owners.owner(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, False)
        owner = await ownership.get(CRITICAL)
        assert owner is not None
        mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
        await watch.wait_for_revision(mark.create_revision, timeout_s=10)
        # The read is fresh (60 s bound), but the watch is past it.
        marked = OwnerRecord(CRITICAL, REGION, epoch, True, "eu-central")
        assert await owners.owner(CRITICAL) == marked
        assert owners.known(CRITICAL) == marked


async def claimed() -> tuple[MemoryCoordination, Ownership, Owner]:
    """An in-memory etcd where REGION has claimed CRITICAL: it, its ownership and owner."""
    coord = MemoryCoordination()
    ownership = Ownership(coord)
    await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    owner = await ownership.get(CRITICAL)
    assert owner is not None
    return coord, ownership, owner


class HandWatch:
    """A watched map the test sets by hand: stuck before a handover mark (it has not
    delivered it yet), or moved on as a watch delivering events would."""

    def __init__(self, owner: Owner, revision: int) -> None:
        self.found, self.revision = owner, revision

    def owner(self, dataset: str) -> Owner | None:
        return self.found if dataset == self.found.dataset else None


async def test_known_answers_from_a_read_newer_than_the_watch() -> None:
    """A read that saw the mark froze the fence before the watch delivered it: `known`
    (the replica's check without I/O) must say so too, target included, or the
    handover's target refuses the owner's catch-up that its fresh check admits."""
    coord, ownership, owner = await claimed()
    epoch = owner.epoch
    mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
    fence = FencedResource()
    owners = EtcdOwners(coord, fence, watched=HandWatch(owner, mark.create_revision - 1))
    assert owners.known(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, False)  # watch only
    await owners.read_fresh(CRITICAL)
    assert owners.known(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, True, "eu-central")
    with pytest.raises(DatasetHandingOverError):  # the read froze the fence
        fence.admit(CRITICAL, epoch)
    central = admission_in("eu-central", fence, owners)
    central.admit_replica(CRITICAL, epoch, REGION)  # the target takes it through the freeze


async def test_a_fresh_read_does_not_lift_a_freeze_the_watch_set_during_it() -> None:
    """A replica's fresh owner read answers from before a handover mark that the watch
    delivers (freezing the fence) while the read is under way: the copy is refused as
    handing over, and the fence stays frozen (the read's older answer used to lift it)."""
    coord, ownership, owner = await claimed()
    epoch = owner.epoch
    fence = FencedResource()
    fence.observe(CRITICAL, epoch, handing_over=False)
    watch = HandWatch(owner, epoch)  # the owner key's revision is its epoch
    read = coord.txn
    marking: list[bool] = []

    async def read_then_marked(*args: Any, **kwargs: Any) -> Any:
        answer = await read(*args, **kwargs)  # etcd's state before the mark
        if marking:  # the mark's own transaction
            return answer
        marking.append(True)
        mark = await ownership.begin_handover(CRITICAL, owner, "us-east", "t")
        marked = await ownership.get(CRITICAL)
        assert marked is not None
        watch.found, watch.revision = marked, mark.create_revision
        fence.observe(CRITICAL, epoch, handing_over=True)  # as the watch does
        return answer

    coord.txn = read_then_marked  # type: ignore[method-assign]
    owners = EtcdOwners(coord, fence, watched=watch)
    replica = Admission(
        "eu-central",
        StaticPolicy(compiled(REGIONS, world())),
        fence,
        owners,
        AgentMetrics("eu-central"),
        fresh_owner=owners.owner_now,
    )
    with pytest.raises(DatasetHandingOverError):
        await replica.admit_replica_current(CRITICAL, epoch, REGION)
    with pytest.raises(DatasetHandingOverError):  # still frozen
        fence.admit(CRITICAL, epoch)


async def test_an_older_read_ending_late_answers_with_the_newer_one() -> None:
    """A fresh read served by etcd before a handover mark ends after a bounded-age read
    that saw the mark (and froze the fence): it neither replaces that read nor answers
    without the mark, so admission never lifts the freeze with it."""
    coord, ownership, owner = await claimed()
    epoch = owner.epoch
    fence = FencedResource()
    clock = Clock()
    owners = EtcdOwners(coord, fence, max_age_s=0.5, clock=clock)
    read = coord.txn
    served, release = asyncio.Event(), asyncio.Event()

    async def held_after_reading(*args: Any, **kwargs: Any) -> Any:
        answer = await read(*args, **kwargs)
        if not served.is_set():  # the first read: answered now, returned late
            served.set()
            await asyncio.wait_for(release.wait(), timeout=5)
        return answer

    coord.txn = held_after_reading  # type: ignore[method-assign]
    late = asyncio.create_task(owners.owner_now(CRITICAL))
    await asyncio.wait_for(served.wait(), timeout=5)
    await ownership.begin_handover(CRITICAL, owner, "us-east", "t")
    clock.now += 1  # past the bound: the next owner() reads etcd again, and sees the mark
    marked = OwnerRecord(CRITICAL, REGION, epoch, True, "us-east")
    assert await owners.owner(CRITICAL) == marked
    release.set()
    assert await asyncio.wait_for(late, timeout=5) == marked
    assert owners.known(CRITICAL) == marked
    with pytest.raises(DatasetHandingOverError):
        fence.admit(CRITICAL, epoch)


async def test_after_a_committed_handover_the_old_epoch_is_never_accepted() -> None:
    # No watch at all and no reuse (max_age 0): every write reads etcd.
    coord = MemoryCoordination()
    ownership = Ownership(coord)
    old = await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    west_fence, central_fence = FencedResource(), FencedResource()
    west = admission_in(REGION, west_fence, EtcdOwners(coord, west_fence, max_age_s=0))
    central = admission_in(
        "eu-central", central_fence, EtcdOwners(coord, central_fence, max_age_s=0)
    )
    assert (await west.admit_write(CRITICAL, None)).epoch == old
    owner = await ownership.get(CRITICAL)
    assert owner is not None
    mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
    with pytest.raises(DatasetHandingOverError):
        await west.admit_write(CRITICAL, old)
    # The read names the target (a replica there takes the owner's catch-up).
    read = await EtcdOwners(coord, FencedResource(), max_age_s=0).owner(CRITICAL)
    assert read == OwnerRecord(CRITICAL, REGION, old, True, "eu-central")
    await coord.put("/meridian/regions/eu-central/alive", b"x")
    new = await ownership.complete_handover(mark, reason="switchover", actor="t")
    with pytest.raises(NotOwnerError):
        await west.admit_write(CRITICAL, old)
    with pytest.raises(StaleEpochError):
        await central.admit_write(CRITICAL, old)
    assert (await central.admit_write(CRITICAL, None)).epoch == new
    # The read says how ownership moved, and from which epoch (the owner's push reads
    # a handover that ended its write's epoch from these).
    read = await EtcdOwners(coord, FencedResource(), max_age_s=0).owner(CRITICAL)
    assert read is not None
    assert (read.moved_by, read.moved_from, read.epoch_before) == ("switchover", REGION, old)


async def test_an_unreadable_owner_record_fails_closed() -> None:
    coord = MemoryCoordination()
    await coord.put(f"/meridian/owners/{CRITICAL}", b"not json")
    with pytest.raises(UnavailableError, match="unreadable"):
        await EtcdOwners(coord, FencedResource()).owner(CRITICAL)


# -- against real etcd ---------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    # Below the ephemeral range (controlplane/loopback.py): a port the kernel gave a probe
    # socket may be any outgoing connection's source port by the time etcd binds it.
    client = free_block((0, 1))
    cluster = start_etcd_cluster(
        tmp_path_factory.mktemp("etcd-owners"), members=1, client_port=client, peer_port=client + 1
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def etcd(etcd1: EtcdCluster) -> AsyncIterator[EtcdCoordination]:
    async with EtcdCoordination(etcd1.endpoints, timeout_s=5) as coord:
        await coord.delete("/meridian/", prefix=True)
        yield coord


@pytest.mark.integration
async def test_a_switchover_in_real_etcd_fences_the_old_owners_writes(
    etcd: EtcdCoordination, tmp_path: Path
) -> None:
    ownership = Ownership(etcd)
    old = await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    async with OwnershipWatch(etcd, fence, retry_initial_s=0.05) as watch:
        owners = EtcdOwners(etcd, fence, watched=watch, max_age_s=0.5)
        agent = await start_agent(tmp_path / "root", owners_source=owners, fence=fence)
        try:
            resp = await put(agent, CRITICAL, "shard-0", b"epoch attached")
            assert agent.replication.writes[-1].admitted.epoch == old
            assert resp.version.size == len(b"epoch attached")

            owner = await ownership.get(CRITICAL)
            assert owner is not None
            mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
            # The thing tested: the read's age passes max_age_s (0.5 s), whatever the
            # watch delivered meanwhile; only time passing makes that so.
            await asyncio.sleep(0.6)
            frozen, _ = await refusal(lambda: put(agent, CRITICAL, "shard-1", b"frozen", epoch=old))
            assert frozen.code() == grpc.StatusCode.UNAVAILABLE
            assert isinstance(from_rpc_error(frozen), DatasetHandingOverError)

            await etcd.put("/meridian/regions/eu-central/alive", b"x")
            new = await ownership.complete_handover(mark, reason="switchover", actor="t")
            # At once, before waiting for the watch: never accepted at the old epoch
            # (the read, or the watch, still holds the freeze, or already the move).
            late, _ = await refusal(lambda: put(agent, CRITICAL, "shard-1", b"late", epoch=old))
            assert late.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            await watch.wait_for_revision(new, timeout_s=10)
            assert owners.known(CRITICAL) == OwnerRecord(CRITICAL, "eu-central", new)
            assert fence.highest_epoch(CRITICAL) == new
            moved, _ = await refusal(lambda: put(agent, CRITICAL, "shard-1", b"not the owner"))
            assert isinstance(from_rpc_error(moved), NotOwnerError)
            assert [s.key for s in agent.store.list_objects(CRITICAL).items] == ["shard-0"]
        finally:
            await stop_agent(agent)
