"""Synchronous replication of critical writes against real agent processes and etcd:
acked writes are held by at least `ack` regions (by digest), a replica that is down
fails the writes a 2-of-2 quorum needs and not those of a 2-of-3 one, and replicas
refuse copies at an epoch etcd no longer gives (a paused former owner included)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator

import grpc
import pytest
from critical_helpers import put, stat, wait_stat_digest
from harness.agent_process import AgentProcess
from waiting import until

from agents.client import AgentClient
from agents.rpc.status import code_of
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import MeridianError
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

Agents = dict[str, AgentProcess]


async def claim(coord: EtcdCoordination, dataset: str, region: str = "eu-west") -> int:
    epoch = await Ownership(coord).claim(
        dataset, region, expect_epoch=0, reason="home", actor="test"
    )
    assert epoch is not None
    return epoch


async def test_an_acked_write_is_held_by_the_regions_it_names(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west = eu_agents["eu-west"]
    await claim(coord, "pair/a")
    await claim(coord, "every/a")
    data = b"checkpoint shard " * 70_000  # > 1 MiB: several chunks

    pair = await put(west.address, "pair/a", "k", data)
    assert list(pair.regions) == ["eu-west", "eu-central"]
    every = await put(west.address, "every/a", "k", data)
    assert sorted(every.regions) == ["eu-central", "eu-north", "eu-west"]
    # Acked means committed there, at once: no waiting.
    for region in every.regions:
        held = await stat(eu_agents[region].address, "every/a", "k")
        assert held is not None
        assert (held.version.hlc, held.version.digest) == (every.version.hlc, every.version.digest)
    held = await stat(eu_agents["eu-central"].address, "pair/a", "k")
    assert held is not None and held.version.digest == pair.version.digest
    assert await stat(eu_agents["eu-north"].address, "pair/a", "k") is None  # not a replica


async def test_a_replica_down_fails_a_two_of_two_quorum_not_a_two_of_three(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west = eu_agents["eu-west"]
    for dataset in ("pair/b", "tri/b", "every/b"):
        await claim(coord, dataset)
    assert eu_agents["eu-central"].stop() == 0  # deregistered: its lease revoked

    tri = await put(west.address, "tri/b", "k", b"two of three")
    assert sorted(tri.regions) == ["eu-north", "eu-west"]
    assert await wait_stat_digest(eu_agents["eu-north"].address, "tri/b", "k", tri.version.digest)
    for dataset in ("pair/b", "every/b"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await put(west.address, dataset, "k", b"needs eu-central")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # retriable
        details = caught.value.details() or ""
        assert "not acked" in details
        assert "eu-central: region eu-central has no agent registered" in details
        # The owner's copy stays (unacked); nothing reached the replica that was up.
        assert await stat(west.address, dataset, "k") is not None

    eu_agents["eu-central"].start()
    # Back: once caught up (the owner pushes what it missed) it counts again; until
    # then a write is refused as retriable, and a client retries (bounded here).
    again = await put_until_acked(west.address, "pair/b", "k", b"after the return")
    assert list(again.regions) == ["eu-west", "eu-central"]
    # every/b was not written since: its catch-up alone brings the missed version.
    unacked = await stat(west.address, "every/b", "k")
    assert unacked is not None
    central = eu_agents["eu-central"].address
    assert await wait_stat_digest(central, "every/b", "k", unacked.version.digest, 30)


async def put_until_acked(
    address: str, dataset: str, key: str, data: bytes
) -> agent_pb2.PutResponse:
    async def acked() -> agent_pb2.PutResponse | None:
        try:
            return await put(address, dataset, key, data)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    return await until(acked, 60, what=f"{dataset}/{key} acked", step_s=0.25)


async def replicate(
    address: str, dataset: str, version: agent_pb2.Version, data: bytes, epoch: int
) -> agent_pb2.ReplicateResponse:
    async def frames() -> object:
        header = agent_pb2.ReplicateHeader(
            dataset=dataset, key="k", version=version, epoch=epoch, origin_region="eu-west"
        )
        yield agent_pb2.ReplicateRequest(header=header)
        yield agent_pb2.ReplicateRequest(chunk=data)

    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        return await stub.Replicate(frames(), timeout=10)  # type: ignore[arg-type]


async def test_a_replica_refuses_an_old_epoch_and_a_handover(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, north = eu_agents["eu-west"], eu_agents["eu-north"]
    epoch1 = await claim(coord, "tri/c")
    first = await put(west.address, "tri/c", "k", b"at epoch one")
    own = Ownership(coord)
    owner = await own.get("tri/c")
    assert owner is not None
    mark = await own.begin_handover("tri/c", owner, "eu-central", "test")
    with pytest.raises(grpc.aio.AioRpcError) as frozen:
        await replicate(north.address, "tri/c", first.version, b"at epoch one", epoch1)
    assert frozen.value.code() == grpc.StatusCode.UNAVAILABLE

    await coord.put(keys.alive("eu-central"), b"{}")  # a move needs a live target
    epoch2 = await own.complete_handover(mark, reason="switchover", actor="test")
    assert epoch2 > epoch1

    async def refusal() -> grpc.StatusCode | None:
        try:
            await replicate(north.address, "tri/c", first.version, b"at epoch one", epoch1)
        except grpc.aio.AioRpcError as err:
            # Until eu-north's watch has seen the mark go, it still says "handing over".
            return None if err.code() == grpc.StatusCode.UNAVAILABLE else err.code()
        raise AssertionError("a copy at the old epoch was accepted after the move")

    stale = await until(refusal, 15, "eu-north's refusal once it has seen the move")
    assert stale == grpc.StatusCode.FAILED_PRECONDITION
    # The deposed owner's own writes are refused too.
    with pytest.raises(grpc.aio.AioRpcError) as deposed:
        await put(west.address, "tri/c", "k", b"after the move")
    assert deposed.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_paused_owner_cannot_get_a_write_accepted_after_a_failover(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, central, north = (eu_agents[r] for r in ("eu-west", "eu-central", "eu-north"))
    epoch1 = await claim(coord, "tri/d")
    acked = await put(west.address, "tri/d", "k", b"before the pause")
    assert await wait_stat_digest(north.address, "tri/d", "k", acked.version.digest)

    west.signal(signal.SIGSTOP)
    try:
        # Failover meanwhile: eu-central takes the dataset at a newer epoch.
        epoch2 = await Ownership(coord).claim(
            "tri/d", "eu-central", expect_epoch=epoch1, reason="failover", actor="test"
        )
        assert epoch2 is not None and epoch2 > epoch1
        new = await put(central.address, "tri/d", "k", b"new owner")
        assert "eu-central" in new.regions and len(new.regions) >= 2
    finally:
        west.signal(signal.SIGCONT)

    # Through AgentClient: a refusal at the header, while the writer still sends, may
    # reach a raw stub as INTERNAL (grpc/grpc#36066, seen here once under load); the
    # client asks again with the header alone and raises the agent's own error.
    async with AgentClient(west.address) as client:
        for attempt in range(5):
            with pytest.raises(MeridianError) as refused:
                await client.put("tri/d", "k", _chunks(f"woken up {attempt}".encode()))
            assert code_of(refused.value) == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    # Nothing of the woken owner reached a replica: they hold the new owner's version.
    for proc in (central, north):
        held = await stat(proc.address, "tri/d", "k")
        assert held is not None and held.version.hlc == new.version.hlc
    # A copy pushed at the old epoch is refused by every other region, and counted.
    for proc in (central, north):
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await replicate(proc.address, "tri/d", acked.version, b"before the pause", epoch1)
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # What the woken owner committed before it learnt (a replica's fence, or its own
    # watch) is dropped there: it ends holding the new owner's version, none of its own.
    assert await wait_stat_digest(west.address, "tri/d", "k", new.version.digest, timeout_s=30)
    held = await stat(west.address, "tri/d", "k")
    assert held is not None and held.version.hlc == new.version.hlc


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data
