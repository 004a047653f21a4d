"""`EtcdOwners`: owner records read and watched from the coordination port, fed to the
fence, and re-read when older than the bound; the fake port for units, real etcd for
the integration test."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    REGION,
    REGIONS,
    put,
    start_agent,
    stop_agent,
    world,
)
from fakes.admission import StaticPolicy, compiled
from fakes.coordination import MemoryCoordination

from agents.admission import Admission, OwnerRecord
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
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import UnavailableError
from controlplane.ports.coordination import Coordination
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Await a condition the watch makes true (bounded in time and count)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.02) + 1):
        if pred():
            return True
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    return pred()


def admission_in(
    region: str, coord: Coordination, fence: FencedResource, owners: EtcdOwners
) -> Admission:
    policy = StaticPolicy(compiled(REGIONS, world()))
    return Admission(region, policy, fence, owners, AgentMetrics(region))


async def test_it_reads_every_owner_at_start_and_feeds_the_fence() -> None:
    coord = MemoryCoordination()
    epoch = await Ownership(coord).claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    async with EtcdOwners(coord, fence) as owners:
        assert owners.known(CRITICAL) == OwnerRecord(CRITICAL, REGION, epoch, False)
        assert fence.highest_epoch(CRITICAL) == epoch
        assert await owners.owner("unowned/ds") is None


async def test_the_watch_follows_moves_and_handover_marks() -> None:
    coord = MemoryCoordination()
    ownership = Ownership(coord)
    epoch = await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    async with EtcdOwners(coord, fence) as owners:
        owner = await ownership.get(CRITICAL)
        assert owner is not None
        mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
        assert await until(lambda: (owners.known(CRITICAL) or owner).handing_over)  # type: ignore[attr-defined]
        with pytest.raises(DatasetHandingOverError):
            fence.admit(CRITICAL, epoch)
        await ownership.abort_handover(mark)
        assert await until(lambda: not owners.known(CRITICAL).handing_over)  # type: ignore[union-attr]
        assert fence.admit(CRITICAL, epoch) == epoch
        owner = await ownership.get(CRITICAL)
        assert owner is not None
        mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
        await coord.put("/meridian/regions/eu-central/alive", b"x")
        new = await ownership.complete_handover(mark, reason="switchover", actor="t")
        assert await until(
            lambda: owners.known(CRITICAL) == OwnerRecord(CRITICAL, "eu-central", new)
        )
        assert fence.highest_epoch(CRITICAL) == new
        with pytest.raises(StaleEpochError):
            fence.admit(CRITICAL, epoch)


async def test_a_record_older_than_the_bound_is_re_read_and_etcd_down_fails_closed() -> None:
    coord = MemoryCoordination()
    await Ownership(coord).claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    clock = Clock()
    owners = EtcdOwners(coord, FencedResource(), max_age_s=0.5, clock=clock)
    first = await owners.owner(CRITICAL)
    coord.set_unavailable(True)
    clock.now += 0.4
    assert await owners.owner(CRITICAL) == first  # within the bound: the cache answers
    clock.now += 0.2
    with pytest.raises(UnavailableError, match="cannot be read from etcd"):
        await owners.owner(CRITICAL)
    coord.set_unavailable(False)
    assert await owners.owner(CRITICAL) == first


async def test_after_a_committed_handover_the_old_epoch_is_never_accepted() -> None:
    # No watch at all (not started) and no cache (max_age 0): every write reads etcd.
    coord = MemoryCoordination()
    ownership = Ownership(coord)
    old = await ownership.claim(CRITICAL, REGION, expect_epoch=0, reason="home", actor="t")
    west_fence, central_fence = FencedResource(), FencedResource()
    west = admission_in(REGION, coord, west_fence, EtcdOwners(coord, west_fence, max_age_s=0))
    central = admission_in(
        "eu-central", coord, central_fence, EtcdOwners(coord, central_fence, max_age_s=0)
    )
    assert (await west.admit_write(CRITICAL, None)).epoch == old
    owner = await ownership.get(CRITICAL)
    assert owner is not None
    mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
    await coord.put("/meridian/regions/eu-central/alive", b"x")
    new = await ownership.complete_handover(mark, reason="switchover", actor="t")
    with pytest.raises(NotOwnerError):
        await west.admit_write(CRITICAL, old)
    with pytest.raises(StaleEpochError):
        await central.admit_write(CRITICAL, old)
    assert (await central.admit_write(CRITICAL, None)).epoch == new


# -- against real etcd ---------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def etcd1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    import warnings

    client, peer = _free_ports(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the launcher drops its Popen handles
        cluster = start_etcd_cluster(
            tmp_path_factory.mktemp("etcd-owners"), members=1, client_port=client, peer_port=peer
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
    async with EtcdOwners(etcd, fence, max_age_s=0.5) as owners:
        agent = await start_agent(tmp_path / "root", owners_source=owners, fence=fence)
        try:
            resp = await put(agent, CRITICAL, "shard-0", b"epoch attached")
            assert agent.replication.writes[-1].admitted.epoch == old
            assert resp.version.size == len(b"epoch attached")

            owner = await ownership.get(CRITICAL)
            assert owner is not None
            mark = await ownership.begin_handover(CRITICAL, owner, "eu-central", "t")
            # Whatever the watch has delivered, a write now is refused: either the mark
            # was seen, or the cache was old and etcd was re-read.
            await asyncio.sleep(0.6)  # past the bound: the next write must re-read
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await put(agent, CRITICAL, "shard-1", b"frozen", epoch=old)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert isinstance(from_rpc_error(caught.value), DatasetHandingOverError)

            await etcd.put("/meridian/regions/eu-central/alive", b"x")
            new = await ownership.complete_handover(mark, reason="switchover", actor="t")
            # At once, before waiting for any watch: never accepted at the old epoch.
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await put(agent, CRITICAL, "shard-1", b"late", epoch=old)
            assert caught.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            assert await until(
                lambda: owners.known(CRITICAL) == OwnerRecord(CRITICAL, "eu-central", new)
            )
            assert fence.highest_epoch(CRITICAL) == new
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await put(agent, CRITICAL, "shard-1", b"not the owner")
            assert isinstance(from_rpc_error(caught.value), NotOwnerError)
            names = [s.key for s in agent.store.list_objects(CRITICAL).items]
            assert names == ["shard-0"]
        finally:
            await stop_agent(agent)
