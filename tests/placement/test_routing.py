"""Routing inside a region of real agents (issue 16): any agent takes any call, writes
are acked once r agents hold them, reads and listings cover the region."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from harness.controllers import run_cli
from region_harness import RegionOfAgents, copies

from agents.client import AgentClient
from agents.placement import Member, hrw
from agents.routing.peers import ROUTED_KEY
from agents.rpc.status import from_rpc_error
from controlplane.errors import NotFoundError, UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

ROUTED = ((ROUTED_KEY, "a-test-standing-in-for-a-peer"),)

pytestmark = pytest.mark.integration


async def test_any_agent_takes_writes_and_reads(region: RegionOfAgents, tmp_path: Path) -> None:
    region.add(3)
    await region.wait_settled(3)
    regs = await region.registrations()
    members = [Member(i, str(doc["endpoint"]), int(str(doc["weight"]))) for i, doc in regs.items()]
    a, b, _c = region.agents
    async with AgentClient(a.address) as ca, AgentClient(b.address) as cb:
        for i in range(12):
            src = tmp_path / f"in{i}"
            src.write_bytes(f"payload {i}".encode())
            await ca.put("corpus/a", f"k{i:02d}", src)
        held = copies(await region.holdings())
        assert len(held) == 12
        for i in range(12):
            owners = {m.agent_id for m in hrw.owners("corpus/a", f"k{i:02d}", members, 2)}
            assert held[("corpus/a", f"k{i:02d}")] == owners  # exactly the r owners, no other
        for i in range(12):  # read through another agent: one hop when it is no owner
            _, data = await cb.get_bytes("corpus/a", f"k{i:02d}")
            assert data == f"payload {i}".encode()
        listed = await cb.list("corpus/a")
        assert sorted(o.key for o in listed) == [f"k{i:02d}" for i in range(12)]
        await cb.delete("corpus/a", "k00")
        listed = await ca.list("corpus/a")
        assert "k00" not in {o.key for o in listed}


async def test_a_set_taken_by_one_agent_is_read_through_any(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    """A set stays on the agent that took it; GetSet through another agent finds it (the
    newest complete one of the region for "latest"), and the CLI writes its members.
    An agent that does not answer, when no other shows the set, leaves it undecided."""
    region.lease_ttl_s = 30  # b's registration outlives its SIGKILL for the last step
    # ...and only its lease decides: a's fast-fail would otherwise unregister b a moment
    # after its port refuses, and a would then answer "not found".
    region.env = {**region.env, "MERIDIAN_FAST_FAIL_ON_REFUSED": "0"}
    region.add(2)
    await region.wait_members(2)
    a, b = region.agents
    async with AgentClient(a.address) as ca, AgentClient(b.address) as cb:
        with pytest.raises(NotFoundError):
            await cb.get_set("corpus/s", "latest")
        first: dict[str, str] = {}
        for i in range(3):
            src = tmp_path / f"shard{i}"
            src.write_bytes(f"step 1 shard {i}".encode())
            held = await ca.put("corpus/s", f"ckpt/shard{i}", src, set_id="s1")
            first[f"ckpt/shard{i}"] = held.hlc.text
        s1 = await ca.commit_set("corpus/s", "s1", first)
        with pytest.raises(NotFoundError):  # b itself does not hold it: asked alone it says so
            await b_alone_get_set(b.address, "s1")
        for wanted in ("s1", "latest"):
            got = await cb.get_set("corpus/s", wanted)
            assert (got.id, str(got.hlc)) == ("s1", str(s1.hlc))
            assert {m.key: m.version.text for m in got.members} == first
        with pytest.raises(NotFoundError):
            await cb.get_set("corpus/s", "s9")

        # A newer set taken by b: "latest" through a is b's, the older one still by name.
        src = tmp_path / "shard0"
        src.write_bytes(b"step 2 shard 0")
        newer = (await cb.put("corpus/s", "ckpt/shard0", src, set_id="s2")).hlc.text
        s2 = await cb.commit_set("corpus/s", "s2", {"ckpt/shard0": newer})
        latest = await ca.get_set("corpus/s", "latest")
        assert (latest.id, str(latest.hlc)) == ("s2", str(s2.hlc))
        assert (await ca.get_set("corpus/s", "s1")).id == "s1"

    out = tmp_path / "out"
    done = run_cli(
        ["object", "get", "--dataset", "corpus/s", "--set", "s1", str(out), "--agent", b.address],
        region.env,
    )
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in (out / "ckpt").iterdir()} == {
        f"shard{i}": f"step 1 shard {i}".encode() for i in range(3)
    }

    b.kill()  # still registered: s2, only b's, may be there, so it is not "not found"
    async with AgentClient(a.address) as ca:
        with pytest.raises(UnavailableError, match="not every agent could say"):
            await ca.get_set("corpus/s", "s2")
        assert (await ca.get_set("corpus/s", "latest")).id == "s1"  # the newest a reader can get


async def b_alone_get_set(address: str, set_id: str) -> None:
    """GetSet answered by that agent alone (as a routed peer call is)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await agent_pb2_grpc.AgentStub(channel).GetSet(
                agent_pb2.GetSetRequest(dataset="corpus/s", set=set_id),
                timeout=10,
                metadata=ROUTED,
            )
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, address) from err
