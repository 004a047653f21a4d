"""Departed agents (issue 13, agents/placement/departures.py) in a region of three real
agents at r=2: a SIGKILLed agent leaves its roster entry, and while one stands without a
registration a `complete` listing is refused retriable, naming it; a restart clears it,
a settled rebalance clears what the copies cover, and a SIGTERM drain leaves none. A set
no agent shows is "not found" only while no agent has departed (retriable otherwise)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from region_harness import RegionOfAgents, until

from agents.client import AgentClient
from agents.placement.departures import roster_of
from controlplane.adapters.etcd import EtcdCoordination
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

DATASET = "corpus/a"


async def roster(region: RegionOfAgents) -> dict[str, dict[str, object]]:
    coord = EtcdCoordination([region.env["MERIDIAN_ETCD"]], timeout_s=5.0)
    await coord.connect()
    try:
        kvs, _ = await coord.get_prefix(roster_of(region.region))
    finally:
        await coord.close()
    return {kv.key.rsplit("/", 1)[-1]: json.loads(kv.value) for kv in kvs}


async def complete_list(
    address: str, page_size: int = 1000
) -> agent_pb2.ListResponse | grpc.aio.AioRpcError:
    """A proof's listing (complete=True) through `address`: the answer, or its error."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        request = agent_pb2.ListRequest(dataset=DATASET, page_size=page_size, complete=True)
        try:
            response: agent_pb2.ListResponse = await stub.List(request, timeout=10.0)
        except grpc.aio.AioRpcError as err:
            return err
        return response


async def get_set(address: str, set_id: str) -> agent_pb2.GetSetResponse | grpc.aio.AioRpcError:
    """A set proof's read through `address`: the answer, or its error."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        request = agent_pb2.GetSetRequest(dataset=DATASET, set=set_id)
        try:
            response: agent_pb2.GetSetResponse = await stub.GetSet(request, timeout=10.0)
        except grpc.aio.AioRpcError as err:
            return err
        return response


def code_of(answer: object) -> grpc.StatusCode | None:
    return answer.code() if isinstance(answer, grpc.aio.AioRpcError) else None


async def test_departed_agents_refuse_complete_listings_until_cleared(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    region.env["MERIDIAN_DEPARTURE_RECORDS"] = "1"  # off by default (settings.py)
    region.add(3)
    await region.wait_members(3)
    a, b, c = region.agents
    ida, idb, idc = (region.agent_id(p) for p in (a, b, c))
    everyone = {ida, idb, idc}
    async with AgentClient(a.address) as client:
        for i in range(20):
            src = tmp_path / f"in{i}"
            src.write_bytes(f"payload {i}".encode())
            await client.put(DATASET, f"k{i:02d}", src)

    async def vouched_two() -> bool:
        found = await roster(region)
        return set(found) == everyone and all(e["copies"] == 2 for e in found.values())

    await until(vouched_two, 30, "three roster entries vouching for 2 copies")
    assert isinstance(await complete_list(a.address), agent_pb2.ListResponse)
    assert code_of(await get_set(a.address, "s-none")) == grpc.StatusCode.NOT_FOUND

    # SIGKILL two agents: every object they both held (r=2) is on no survivor.
    b.kill()
    c.kill()
    await region.wait_members(1, timeout_s=30)
    refused = await complete_list(a.address)
    assert isinstance(refused, grpc.aio.AioRpcError), refused
    assert refused.code() == grpc.StatusCode.UNAVAILABLE  # retriable: the pass tries later
    assert idb in str(refused.details()) and idc in str(refused.details())
    # A bad request is refused as bad, not as the region's state makes it.
    invalid = await complete_list(a.address, page_size=100_000)
    assert code_of(invalid) == grpc.StatusCode.INVALID_ARGUMENT, invalid
    # A set the survivor does not show may be on a departed agent: retriable, naming them.
    unshown = await get_set(a.address, "s-none")
    assert code_of(unshown) == grpc.StatusCode.UNAVAILABLE, unshown
    assert isinstance(unshown, grpc.aio.AioRpcError)
    assert idb in str(unshown.details()) and idc in str(unshown.details())
    # The survivor's settled pass keeps them: 2 departed, and they vouched for 2 copies.
    await until(lambda: a.event("roster_kept") is not None, 30, "the survivor keeping them")
    assert set(await roster(region)) == everyone

    # One comes back: it is no longer named; the other is cleared by the settled
    # rebalance (1 departed < 2 copies) once both live agents settled.
    b.start()
    await region.wait_members(2, timeout_s=30)

    async def b_not_named() -> bool:
        answer = await complete_list(a.address)
        return not (isinstance(answer, grpc.aio.AioRpcError) and idb in str(answer.details()))

    await until(b_not_named, 30, "the restarted agent no longer named")

    async def c_cleared() -> bool:
        return idc not in await roster(region)

    await until(c_cleared, 60, "the settled rebalance clearing the other's entry")

    # What etcd shows, b's own membership watch shows a moment later.
    async def b_answers_whole() -> bool:
        return isinstance(await complete_list(b.address), agent_pb2.ListResponse)

    async def b_says_not_found() -> bool:
        return code_of(await get_set(b.address, "s-none")) == grpc.StatusCode.NOT_FOUND

    await until(b_answers_whole, 10, "b's complete listing once c is cleared")
    await until(b_says_not_found, 10, "b's GetSet of an unknown set: not found")

    # A SIGTERM drain that handed everything over leaves no entry behind.
    c_root_entry = set(await roster(region))
    assert c_root_entry == {ida, idb}
    a.stop()
    await region.wait_members(1, timeout_s=30)
    assert a.event("drain_complete") is not None, a.log_tail()
    assert set(await roster(region)) == {idb}
    await until(b_answers_whole, 10, "b's complete listing once a drained")


async def test_without_the_setting_no_roster_entry_is_written(region: RegionOfAgents) -> None:
    """Departure records are off by default (settings.py): an agent writes no entry."""
    region.add(1)
    await region.wait_members(1)
    assert await roster(region) == {}


async def test_an_agent_holding_a_set_vouches_for_one_copy_and_keeps_its_entry(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    """A version set's members stay on the agent that took it (the rebalance does not
    move them): that agent's entry vouches for 1 copy before the first member is acked
    (no settled pass runs after it here), and a SIGTERM drain, which moves its other
    objects, does not count as handing everything over."""
    region.env["MERIDIAN_DEPARTURE_RECORDS"] = "1"
    region.env["MERIDIAN_REBALANCE_INTERVAL_S"] = "3600"  # passes only on membership changes
    region.add(2)
    await region.wait_members(2)
    a, b = region.agents
    ida, idb = region.agent_id(a), region.agent_id(b)
    src = tmp_path / "member"
    src.write_bytes(b"a member of s1")

    async def both_vouch_two() -> bool:
        found = await roster(region)
        return found.get(ida, {}).get("copies") == 2 and found.get(idb, {}).get("copies") == 2

    await until(both_vouch_two, 30, "both entries vouching for 2 copies")
    async with AgentClient(a.address) as client:
        member = await client.put(DATASET, "ckpt/m0", src, set_id="s1")
        assert (await roster(region))[ida]["copies"] == 1  # lowered before the ack
        await client.commit_set(DATASET, "s1", {"ckpt/m0": member.hlc})
        await client.put(DATASET, "plain", src)  # an object the drain does hand over

    async def a_vouches_one() -> bool:
        found = await roster(region)
        return found.get(ida, {}).get("copies") == 1 and found.get(idb, {}).get("copies") == 2

    await until(a_vouches_one, 30, "the set's holder vouching for 1 copy, the other for 2")
    # A tombstone in a set is a member too: b's entry is lowered before its ack.
    async with AgentClient(b.address) as client:
        await client.put(DATASET, "ckpt/gone", src)
        assert (await roster(region))[idb]["copies"] == 2
        await client.delete(DATASET, "ckpt/gone", set_id="s2")
    assert (await roster(region))[idb]["copies"] == 1
    a.stop()
    await region.wait_members(1, timeout_s=30)
    drained = a.event("drain_complete")
    assert drained is not None and drained["sets_kept"] is True, a.log_tail()
    assert a.event("drain_kept_sets") is not None  # the operator is told why
    assert set(await roster(region)) == {ida, idb}  # its entry stays: s1 is on it alone
