"""A replicator started without --agent follows its region's registrations
(replicator/agent_follow.py): the agent in use stays while it is registered, the first
registered one replaces it once its registration is gone, routed as
MERIDIAN_AGENT_ROUTES says; none registered (or etcd out of reach) changes nothing."""

from __future__ import annotations

import json

import pytest
from fakes.coordination import MemoryCoordination
from waiting import until

from controlplane.coordination.protocols import keys
from replicator import agent_grpc
from replicator.agent_follow import AgentFollower
from replicator.agent_grpc import GrpcAgent


async def register(coord: MemoryCoordination, agent_id: str, endpoint: str) -> None:
    await coord.put(keys.agent("eu-central", agent_id), json.dumps({"endpoint": endpoint}).encode())


async def test_the_agent_in_use_is_replaced_once_its_registration_is_gone() -> None:
    coord = MemoryCoordination()
    await register(coord, "c1", "10.0.0.1:7400")
    await register(coord, "c2", "10.0.0.2:7400")
    await coord.put(keys.agent("eu-west", "w1"), json.dumps({"endpoint": "10.9.0.1:7400"}).encode())
    async with GrpcAgent("10.0.0.2:7400") as agent:
        follower = AgentFollower(agent, coord, "eu-central")
        assert await follower.check() is None  # still registered: kept, not the first
        assert agent.address == "10.0.0.2:7400"
        await coord.delete(keys.agent("eu-central", "c2"))
        assert await follower.check() == "10.0.0.1:7400"
        assert agent.address == "10.0.0.1:7400"
        await coord.delete(keys.agent("eu-central", "c1"))
        assert await follower.check() is None  # none registered: nothing better to dial
        assert agent.address == "10.0.0.1:7400"
        # One that names no host:port is skipped (no client could dial it), not retried.
        await register(coord, "c0", "not-an-address")
        await register(coord, "c4", "10.0.0.4:7400")
        assert await follower.check() == "10.0.0.4:7400"
        assert len(agent._retired) == 2
        # Their channels stay open for the calls still on them, then close.
        assert await agent.close_retired() == 0
        assert await agent.close_retired(after_s=0) == 2 and not agent._retired


async def test_the_follower_runs_by_itself_and_routes_the_new_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coord = MemoryCoordination()
    await register(coord, "c1", "10.0.0.1:7400")

    def route(region: str, address: str) -> str:
        return "127.0.0.1:9400" if address == "10.0.0.3:7400" else address

    async with (
        GrpcAgent("10.0.0.1:7400", route=route) as agent,
        AgentFollower(agent, coord, "eu-central", interval_s=0.01) as follower,
    ):
        await coord.delete(keys.agent("eu-central", "c1"))
        await register(coord, "c3", "10.0.0.3:7400")
        await until(lambda: agent.address == "127.0.0.1:9400", 5, "the new agent, routed")
        assert len(agent._retired) == 1  # the old one's channel, open for its calls
        monkeypatch.setattr(agent_grpc, "RETIRED_CLOSE_S", 0.0)
        await follower.wait_passes(follower.passes + 2)
        assert agent._retired == []  # closed by the follower's next pass
