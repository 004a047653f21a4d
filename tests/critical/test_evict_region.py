"""`meridian dataset evict` of a region of two agents: each agent is asked, a version set
taken by one of them goes with its members once the placement shows it complete, and a
run that leaves the region holding nothing exits 0, its partial pulls gone too. Real
agent processes (one in eu-west, one in eu-central, two in eu-north), etcd, the CLI as a
user runs it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from critical_helpers import critical_policy_doc, topology_doc
from harness.agent_process import AgentProcess
from harness.controllers import apply_world, run_cli
from placement.region_harness import RegionOfAgents
from waiting import until

from agents.client import AgentClient
from agents.routing.peers import ROUTED_KEY
from agents.store.store import DEFAULT_TOMBSTONE_RETENTION_S
from agents.transfer.resume import ResumeBook, ResumeState
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

DS = "tri/ev-region"
KEYS = [f"shard-{i}" for i in range(8)]


def policy(tri_replicas: list[str]) -> str:
    return topology_doc("critical") + critical_policy_doc("tri", "tri/*", tri_replicas, "quorum")


async def newest(address: str) -> dict[str, Version]:
    async with AgentClient(address) as client:
        return {o.key: o.version for o in await client.list(DS, include_deleted=True)}


async def own(address: str) -> set[str]:
    """The keys this one agent holds, deletes included (a routed call stays local)."""
    async with grpc.aio.insecure_channel(address) as channel:
        page = await agent_pb2_grpc.AgentStub(channel).List(
            agent_pb2.ListRequest(dataset=DS, include_deleted=True, page_size=1000),
            metadata=((ROUTED_KEY, "test"),),
            timeout=30,
        )
    return {o.key for o in page.objects}


def evict(env: dict[str, str]) -> tuple[int, dict[str, object], str]:
    argv = ["dataset", "evict", DS, "--region", "eu-north", "--yes", "--output", "json"]
    done = run_cli(argv, env)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


async def test_every_agent_of_the_region_is_asked_and_a_clean_region_exits_0(
    tmp_path: Path, critical_world: dict[str, str], coord: EtcdCoordination
) -> None:
    world = tmp_path / "world"
    apply_world(world, critical_world, policy(["eu-central", "eu-north"]))
    placed = {
        r: AgentProcess(r, tmp_path / r, critical_world, tmp_path / f"{r}.log")
        for r in ("eu-west", "eu-central")
    }
    north = RegionOfAgents(tmp_path / "north", critical_world, "eu-north", lease_ttl_s=10)
    try:
        for proc in placed.values():
            proc.start()
        north.add(2)
        await north.wait_settled(2)
        west = placed["eu-west"]
        await Ownership(coord).claim(DS, "eu-west", expect_epoch=0, reason="home", actor="t")
        async with AgentClient(west.address) as client:
            written = {k: await client.put(DS, k, f"{k} of step 1".encode()) for k in KEYS}
            await client.delete(DS, KEYS[-1])
            await client.commit_set(DS, "step-1", {k: written[k].hlc for k in KEYS[:4]})
        expected = await newest(west.address)

        async def north_holds_it() -> bool:
            return await newest(north.agents[0].address) == expected

        await until(north_holds_it, 30, what="eu-north holding what the owner holds")

        # A region of two agents keeps two copies of each object (r defaults to 2): the
        # agent the push reached copies it to the other in the background, so the counts
        # are compared only once both hold every key.
        async def both_hold_all() -> bool:
            return all([await own(a.address) == set(KEYS) for a in north.agents])

        await until(both_hold_all, 30, what="both agents of eu-north holding every key")
        held = {a.address: await own(a.address) for a in north.agents}
        # A pull of shard-0 cut midway left its partial bytes on each agent's disk.
        at = expected["shard-0"].hlc.text
        books = [ResumeBook(proc.root) for proc in north.agents]
        for book in books:
            book.partial_path(DS, "shard-0", at).write_bytes(b"shard-0 of st")
            book.save(ResumeState("t-cut", DS, "shard-0", at, "raw", "", 13, 13, time.time()))

        # The retention and clock an expired delete is judged by come from these agents.
        async with AgentClient(placed["eu-central"].address) as client:
            health = await client.health()
        assert health.tombstone_retention_ms == 1000 * DEFAULT_TOMBSTONE_RETENTION_S
        assert health.now_ms is not None and abs(health.now_ms - time.time() * 1000) < 60_000

        apply_world(world, critical_world, policy(["eu-central"]))
        result: tuple[int, dict[str, object], str] = (0, {}, "")

        async def evicted() -> bool:
            nonlocal result
            result = await asyncio.to_thread(evict, critical_world)
            agents = result[1].get("agents")
            assert isinstance(agents, list), result
            return not any("as this agent sees it" in str(a["error"]) for a in agents)

        await until(evicted, 30, what="eu-north's agents to see the new policy", step_s=0.5)
        code, done, err = result
        assert code == 0, (err, done)
        assert done["evicted"] == len(KEYS) and done["kept"] == [], done
        assert done["sets"] and str(done["sets"][0]).startswith("step-1@"), done  # type: ignore[index]
        asked = done["agents"]
        assert isinstance(asked, list)
        assert sorted(a["endpoint"] for a in asked) == sorted(held)
        assert sum(int(a["objects"]) for a in asked) == sum(map(len, held.values()))
        for proc in north.agents:
            assert await own(proc.address) == set()
        for book in books:  # the partial bytes went with the copies
            assert book.load(DS, "shard-0", at) is None
            assert not book.partial_path(DS, "shard-0", at).exists()
        # An agent refuses a proof made under another placement (retriable).
        async with AgentClient(north.agents[1].address) as client:
            with pytest.raises(UnavailableError, match="proven under another placement"):
                await client.evict(DS, [], placement_digest="0" * 64)
        for proc in placed.values():  # the placement's copies are untouched
            assert await newest(proc.address) == expected
    finally:
        north.stop_all()
        for proc in placed.values():
            if proc.running:
                proc.stop()
