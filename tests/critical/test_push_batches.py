"""Batched critical pushes (agents/replication/push_lanes.py, replica_pushes.py)
against real agent processes and etcd: concurrent writes go to each replica several
per ReplicatePushes call, and each is still acked only once held by its quorum; a
replica fences each item of a batch on its own (a stale epoch refused, the others
committed); during a handover only its target takes a batch or a set (and no
Rewind); a malformed batch stores nothing."""

from __future__ import annotations

import asyncio
from urllib.request import urlopen

import grpc
import pytest
from critical_helpers import put, stat, wait_stat_digest
from harness.agent_process import AgentProcess

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HLC
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

pytestmark = pytest.mark.integration

Agents = dict[str, AgentProcess]


async def claim(coord: EtcdCoordination, dataset: str, expect: int = 0) -> int:
    epoch = await Ownership(coord).claim(
        dataset, "eu-west", expect_epoch=expect, reason="home", actor="test"
    )
    assert epoch is not None
    return epoch


def batch_calls(agent: AgentProcess) -> float:
    """ReplicatePushes calls this agent answered OK (its metrics endpoint)."""
    with urlopen(f"http://{agent.metrics_address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("meridian_agent_requests_total{")
            and 'call="ReplicatePushes"' in line
            and 'code="OK"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_sum(agent: AgentProcess, name: str, label: str = "") -> float:
    """The sum of `name`'s samples on this agent's metrics endpoint (those with `label`)."""
    with urlopen(f"http://{agent.metrics_address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


async def pushes(
    address: str, items: list[agent_pb2.PushedItem]
) -> agent_pb2.ReplicatePushesResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        return await stub.ReplicatePushes(agent_pb2.ReplicatePushesRequest(items=items), timeout=10)


def item(
    dataset: str, key: str, version: agent_pb2.Version, data: bytes, epoch: int
) -> agent_pb2.PushedItem:
    header = agent_pb2.ReplicateHeader(
        dataset=dataset, key=key, version=version, epoch=epoch, origin_region="eu-west"
    )
    return agent_pb2.PushedItem(header=header, data=data)


async def test_concurrent_writes_are_batched_and_each_acked_by_its_quorum(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west = eu_agents["eu-west"]
    await claim(coord, "tri/batch")
    datas = {f"k{n}": f"shard {n} ".encode() * 100 for n in range(48)}
    async with grpc.aio.insecure_channel(west.address) as channel:
        acked = await asyncio.gather(
            *(put(west.address, "tri/batch", k, d, channel=channel) for k, d in datas.items())
        )
    for key, resp in zip(datas, acked, strict=True):
        assert resp.regions[0] == "eu-west" and len(resp.regions) >= 2
        for region in resp.regions:  # acked: committed in every region it names, now
            held = await stat(eu_agents[region].address, "tri/batch", key)
            assert held is not None, f"{key} not in {region}, which its ack names"
            assert (held.version.hlc, held.version.digest) == (
                resp.version.hlc,
                resp.version.digest,
            )
    calls = batch_calls(eu_agents["eu-central"]) + batch_calls(eu_agents["eu-north"])
    assert calls >= 1, "48 concurrent writes and not one batched push"
    # The owner timed each push: every version it pushed waited once for a call, and
    # each write reached at least the one replica its quorum needed.
    pushed = metric_sum(west, "meridian_critical_push_items_sum")
    assert pushed >= len(datas)
    assert metric_sum(west, "meridian_critical_push_seconds_count", 'stage="queued"') == pushed
    assert 0 < metric_sum(west, "meridian_critical_push_seconds_count", 'stage="call"') <= pushed


async def test_a_batch_refuses_a_stale_epoch_per_item(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, north = eu_agents["eu-west"], eu_agents["eu-north"]
    current = await claim(coord, "tri/fresh")
    old = await claim(coord, "tri/renewed")
    kept = await put(west.address, "tri/fresh", "a", b"kept")
    renewed = await put(west.address, "tri/renewed", "b", b"at the old epoch")
    newer = await claim(coord, "tri/renewed", expect=old)  # re-claimed: a newer epoch
    assert newer > old
    fresh_put = await put(west.address, "tri/fresh", "c", b"one more")  # a version to push
    resp = await pushes(
        north.address,
        [
            item("tri/fresh", "a", kept.version, b"kept", current),
            item("tri/renewed", "b2", renewed.version, b"at the old epoch", old),
            item("tri/fresh", "c", fresh_put.version, b"one more", current),
        ],
    )
    assert resp.region == "eu-north"
    first, stale, last = resp.results
    assert not first.error_class and first.held.hlc == kept.version.hlc
    assert stale.error_class == "StaleEpochError", stale
    assert stale.error_code == "FAILED_PRECONDITION"
    assert not last.error_class and last.held.hlc == fresh_put.version.hlc
    assert await stat(north.address, "tri/renewed", "b2") is None  # refused: not stored


async def test_during_a_handover_only_its_target_takes_the_owner_s_batch(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """The freeze exception (agents/admission.py `_through_handover`) on the batched
    path: the target catches up, every other replica and every Rewind still refuse;
    once the mark goes, the others take the owner's pushes again."""
    west, central, north = (eu_agents[r] for r in ("eu-west", "eu-central", "eu-north"))
    epoch = await claim(coord, "tri/frozen")
    data = b"acked before the freeze"
    base = await put(west.address, "tri/frozen", "a", data)
    ownership = Ownership(coord)
    owner = await ownership.get("tri/frozen")
    assert owner is not None and owner.epoch == epoch
    mark = await ownership.begin_handover("tri/frozen", owner, "eu-north", "test")
    try:
        # A key neither replica holds (the version's bytes are the same, so it is valid).
        catch_up = [item("tri/frozen", "caught-up", base.version, data, epoch)]
        at_target = (await pushes(north.address, catch_up)).results[0]
        assert not at_target.error_class, at_target
        assert at_target.held.hlc == base.version.hlc
        held = await stat(north.address, "tri/frozen", "caught-up")
        assert held is not None and held.version.digest == base.version.digest
        elsewhere = (await pushes(central.address, catch_up)).results[0]
        assert elsewhere.error_class == "DatasetHandingOverError", elsewhere
        assert elsewhere.error_code == "UNAVAILABLE"
        assert await stat(central.address, "tri/frozen", "caught-up") is None
        async with grpc.aio.insecure_channel(north.address) as channel:
            rewind = agent_pb2.RewindRequest(
                dataset="tri/frozen",
                key="caught-up",
                version=base.version,
                epoch=epoch,
                origin_region="eu-west",
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await agent_pb2_grpc.AgentStub(channel).Rewind(rewind, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert await stat(north.address, "tri/frozen", "caught-up") is not None  # kept
    finally:
        assert await ownership.abort_handover(mark)
    after = (await pushes(central.address, catch_up)).results[0]
    assert not after.error_class, after  # the freeze is over: central takes it now


async def test_during_a_handover_only_its_target_takes_the_owner_s_set(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """The freeze exception on the set path (replica_sets.py): a ReplicateSet of the
    owner's at its epoch is recorded by the handover's target, refused as handing over
    by every other replica (which records nothing), and taken by them once the mark
    goes."""
    west, central, north = (eu_agents[r] for r in ("eu-west", "eu-central", "eu-north"))
    dataset = "tri/frozen-set"
    epoch = await claim(coord, dataset)
    members: list[types_pb2.SetMember] = []
    for key in ("m1", "m2"):
        acked = await put(west.address, dataset, key, f"member {key}".encode())
        members.append(types_pb2.SetMember(key=key, version=acked.version.hlc))
        for replica in (central, north):  # a quorum's straggler gets its copy after the ack
            assert await wait_stat_digest(replica.address, dataset, key, acked.version.digest)
    newest = max(HLC.parse(m.version) for m in members)
    stamped = HLC(newest.wall_ms, newest.logical + 1, "eu-west")  # the owner's clock, later
    request = agent_pb2.ReplicateSetRequest(
        sets=[types_pb2.VersionSet(dataset=dataset, id="s1", members=members, hlc=str(stamped))],
        epoch=epoch,
        origin_region="eu-west",
    )
    ownership = Ownership(coord)
    owner = await ownership.get(dataset)
    assert owner is not None and owner.epoch == epoch
    mark = await ownership.begin_handover(dataset, owner, "eu-north", "test")
    try:
        taken = await replicate_set(north.address, request)
        assert [(s.id, s.complete) for s in taken.sets] == [("s1", True)], taken
        assert (await get_set(north.address, dataset)).set.hlc == str(stamped)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await replicate_set(central.address, request)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert "handed over" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as none_there:
            await get_set(central.address, dataset)
        assert none_there.value.code() == grpc.StatusCode.NOT_FOUND, none_there.value.details()
    finally:
        assert await ownership.abort_handover(mark)
    after = await replicate_set(central.address, request)
    assert [(s.id, s.complete) for s in after.sets] == [("s1", True)], after


async def replicate_set(
    address: str, request: agent_pb2.ReplicateSetRequest
) -> agent_pb2.ReplicateSetResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        return await agent_pb2_grpc.AgentStub(channel).ReplicateSet(request, timeout=10)


async def get_set(address: str, dataset: str) -> agent_pb2.GetSetResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        request = agent_pb2.GetSetRequest(dataset=dataset, set="latest")
        return await agent_pb2_grpc.AgentStub(channel).GetSet(request, timeout=10)


async def test_a_batch_naming_a_key_twice_fails_whole_and_stores_nothing(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, north = eu_agents["eu-west"], eu_agents["eu-north"]
    epoch = await claim(coord, "tri/twice")
    one = await put(west.address, "tri/twice", "a", b"one")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await pushes(
            north.address,
            [
                item("tri/twice", "new", one.version, b"one", epoch),
                item("tri/twice", "new", one.version, b"one", epoch),
            ],
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "named twice" in (caught.value.details() or "")
    assert await stat(north.address, "tri/twice", "new") is None
