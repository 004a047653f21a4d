"""A replica decides on etcd's owner record read at the push, not only on the fence its
watch feeds: a watch that lags behind a failover must not let the deposed owner's copy
in (unit test: in-memory policy and owners)."""

from __future__ import annotations

import asyncio

import pytest
from fakes.admission import MemoryOwners, StaticPolicy, compiled
from placements import critical as placed

from agents.admission import Admission
from agents.metrics import AgentMetrics
from agents.replication import copies_needed
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.domain.placement import Placement
from controlplane.errors import FencedError


def critical(replicas: tuple[str, ...], ack: str = "quorum") -> Placement:
    return placed("crit/a", replicas=replicas, ack=ack)


def replica(owners: MemoryOwners) -> tuple[Admission, FencedResource, AgentMetrics]:
    policy = compiled(
        {"eu-west": "EU", "eu-central": "EU", "eu-north": "EU"},
        [critical(("eu-central", "eu-north"))],
    )
    fence, metrics = FencedResource(), AgentMetrics("eu-north", "eu-north-1")
    return Admission("eu-north", StaticPolicy(policy), fence, owners, metrics), fence, metrics


async def test_a_lagging_watch_does_not_let_a_deposed_owner_s_copy_in() -> None:
    owners = MemoryOwners()
    admission, fence, metrics = replica(owners)
    owners.set("crit/a", "eu-west", 5)
    fence.observe("crit/a", 5, handing_over=False)
    await admission.admit_replica_current("crit/a", 5, "eu-west")

    # etcd moved the dataset to eu-central at epoch 9; the fence has not heard yet.
    owners.set("crit/a", "eu-central", 9)
    assert fence.highest_epoch("crit/a") == 5
    admission.admit_replica("crit/a", 5, "eu-west")  # the fence alone would take it
    with pytest.raises(StaleEpochError):
        await admission.admit_replica_current("crit/a", 5, "eu-west")
    assert metrics.stale_epoch_refused.labels(dataset="crit/a")._value.get() == 1
    assert fence.highest_epoch("crit/a") == 9  # and the fence learnt it
    await admission.admit_replica_current("crit/a", 9, "eu-central")


async def test_a_copy_from_a_region_etcd_does_not_name_or_during_a_handover_is_refused() -> None:
    owners = MemoryOwners()
    admission, _, _ = replica(owners)
    owners.set("crit/a", "eu-west", 5)
    with pytest.raises(
        FencedError, match="came from eu-central, but the owner at that epoch is eu-west"
    ):
        await admission.admit_replica_current("crit/a", 5, "eu-central")
    owners.set("crit/a", "eu-west", 5, handing_over=True)
    with pytest.raises(DatasetHandingOverError):
        await admission.admit_replica_current("crit/a", 5, "eu-west")


async def test_a_handover_that_ended_in_etcd_no_longer_refuses_though_the_watch_lags() -> None:
    """The fence still holds the freeze (its watch has not delivered the abort), etcd
    read at the push has none: the copy is taken and the fence learns the freeze is
    over. A pre-check that a fresh read follows leaves the freeze to that read."""
    owners = MemoryOwners()
    admission, fence, metrics = replica(owners)
    owners.set("crit/a", "eu-west", 5)
    fence.observe("crit/a", 5, handing_over=True)
    with pytest.raises(DatasetHandingOverError):  # the watch alone still refuses
        admission.admit_replica("crit/a", 5, "eu-west")
    admission.admit_replica("crit/a", 5, "eu-west", fresh_read_next=True)
    with pytest.raises(StaleEpochError):  # but never an older epoch
        admission.admit_replica("crit/a", 4, "eu-west", fresh_read_next=True)
    await admission.admit_replica_current("crit/a", 5, "eu-west")
    fence.admit("crit/a", 5)  # the freeze is lifted for every write
    assert metrics.handover_refused.labels(dataset="crit/a")._value.get() == 1


async def test_the_handover_s_target_takes_the_owner_s_copies_through_the_freeze() -> None:
    """This replica (eu-north) is the handover's target: the owner's copies at its epoch
    pass (its catch-up must reach the target before the move), nothing else does."""
    owners = MemoryOwners()
    admission, fence, metrics = replica(owners)
    owners.set("crit/a", "eu-west", 5, handing_over=True, to="eu-north")
    fence.observe("crit/a", 5, handing_over=True)
    admission.admit_replica("crit/a", 5, "eu-west")
    await admission.admit_replica_current("crit/a", 5, "eu-west")
    assert fence.highest_epoch("crit/a") == 5
    refused = metrics.handover_refused.labels(dataset="crit/a")
    with pytest.raises(DatasetHandingOverError):  # a drop is no catch-up
        await admission.admit_replica_current("crit/a", 5, "eu-west", rewind=True)
    with pytest.raises(DatasetHandingOverError):  # the freeze stays for the others
        fence.admit("crit/a", 5)
    with pytest.raises(StaleEpochError):  # an older epoch still fails as stale
        await admission.admit_replica_current("crit/a", 4, "eu-west")
    with pytest.raises(FencedError, match="owner at that epoch is eu-west"):
        await admission.admit_replica_current("crit/a", 5, "eu-central")
    assert refused._value.get() == 1
    # Handing over to another region: this replica refuses the owner as any other.
    owners.set("crit/a", "eu-west", 5, handing_over=True, to="eu-central")
    with pytest.raises(DatasetHandingOverError):
        admission.admit_replica("crit/a", 5, "eu-west")
    with pytest.raises(DatasetHandingOverError):
        await admission.admit_replica_current("crit/a", 5, "eu-west")


@pytest.mark.parametrize(
    ("replicas", "ack", "needed"),
    [
        ((), "quorum", 1),
        (("b",), "quorum", 2),
        (("b", "c"), "quorum", 2),
        (("b", "c", "d"), "quorum", 3),
        (("b", "c", "d", "e"), "quorum", 3),
        (("b", "c"), "all", 3),
    ],
)
def test_copies_needed_counts_the_owner_s_own_commit(
    replicas: tuple[str, ...], ack: str, needed: int
) -> None:
    assert copies_needed(critical(replicas, ack)) == needed


async def test_a_new_owner_s_listing_waits_for_copies_past_their_owner_read() -> None:
    """A copy read etcd (eu-west owns at 5), then the dataset failed over before it
    committed. A new owner's complete listing first tells the fence the new epoch (later
    copies of epoch 5 are refused), then waits for that copy: listed after its commit,
    it cannot be missed by the takeover while the deposed owner counts it acked."""
    owners = MemoryOwners()
    admission, fence, _ = replica(owners)
    owners.set("crit/a", "eu-west", 5)
    committed, past_read = asyncio.Event(), asyncio.Event()

    async def receive() -> None:
        with admission.receiving(["crit/a"]):
            await admission.admit_replica_current("crit/a", 5, "eu-west")
            past_read.set()
            await committed.wait()  # the commit, in a thread in the agent

    copy = asyncio.create_task(receive())
    await asyncio.wait_for(past_read.wait(), 5)
    owners.set("crit/a", "eu-central", 9)  # the failover
    listing = asyncio.create_task(admission.settle_for_listing("crit/a"))
    await asyncio.sleep(0.05)  # the window: the listing must wait for the copy
    assert not listing.done()
    assert fence.highest_epoch("crit/a") == 9  # told before it waits
    with pytest.raises(StaleEpochError):  # so a later copy of epoch 5 is refused
        admission.admit_replica("crit/a", 5, "eu-west")
    committed.set()
    await asyncio.wait_for(listing, 5)
    await copy
    # Nothing in flight: a listing waits for nothing; the tracking is gone.
    await asyncio.wait_for(admission.settle_for_listing("crit/a"), 5)
    assert admission._receiving == {}


async def test_a_listing_of_an_unplaced_dataset_reads_no_owner() -> None:
    owners = MemoryOwners()
    admission, _, _ = replica(owners)
    reads: list[str] = []
    owner = owners.owner

    async def counted(dataset: str) -> object:
        reads.append(dataset)
        return await owner(dataset)

    owners.owner = counted  # type: ignore[method-assign,assignment]
    await admission.settle_for_listing("not/placed")
    assert reads == []
    await admission.settle_for_listing("crit/a")
    assert reads == ["crit/a"]
