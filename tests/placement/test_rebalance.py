"""Rebalance inside a region of four real agents (issue 16, *Tests*): a SIGKILLed agent's
objects are back at r copies within seconds and only they moved, while reads and
writes go on; a joining agent takes its share and nothing else moves; a SIGTERMed
agent hands everything over before it exits; twice the weight holds twice the
data; `region show` reports it all."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness.agent_process import AgentProcess
from harness.cli_schema import check_output
from harness.controllers import run_cli
from region_harness import Holdings, RegionOfAgents, copies, until

from agents.client import AgentClient
from agents.placement import Member, hrw

pytestmark = pytest.mark.integration

DATASET = "corpus/a"


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def write(client: AgentClient, folder: Path, keys: list[str], size: int = 2048) -> None:
    del folder  # the bytes stream from memory
    for key in keys:
        await client.put(DATASET, key, chunks(key.encode().ljust(size, b".")))


async def members_of(region: RegionOfAgents) -> list[Member]:
    regs = await region.registrations()
    return [
        Member(i, str(d["endpoint"]), int(str(d["weight"])), state=str(d.get("state", "")))
        for i, d in regs.items()
    ]


def placed(held: Holdings, members: list[Member], r: int, keys: list[str]) -> bool:
    """Every key is on exactly its r owners, nowhere else."""
    where = copies(held)
    return all(
        where.get((DATASET, k)) == {m.agent_id for m in hrw.owners(DATASET, k, members, r)}
        for k in keys
    )


async def test_sigkill_restores_copies_and_moves_only_what_it_held(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    region.add(4)
    await region.wait_settled(4)
    keys = [f"k{i:03d}" for i in range(60)]
    entry = region.agents[0]
    async with AgentClient(entry.address) as client:
        await write(client, tmp_path / "v1", keys)
        before = copies(await region.holdings())
        victim = next(
            p
            for p in region.agents[1:]
            if region.agent_id(p) in {a for s in before.values() for a in s}
        )
        victim_id = region.agent_id(victim)
        lost = {name for name, where in before.items() if victim_id in where}
        assert lost  # with 60 objects on 4 agents it holds about 30

        # Reads and writes through the entry agent keep going while the victim dies.
        failures: list[str] = []
        done = asyncio.Event()

        async def workload() -> int:
            count = 0
            for n in range(10_000):  # bounded; ends when the test says so
                if done.is_set():
                    break
                key = keys[n % len(keys)]
                try:
                    _, data = await client.get_bytes(DATASET, key)
                    assert data.startswith(key.encode())
                    await client.put(DATASET, f"during-{n:04d}", chunks(b"new" * 100))
                except Exception as exc:  # noqa: BLE001 - counted, asserted below
                    failures.append(f"{key}: {exc}")
                count += 1
            return count

        running = asyncio.create_task(workload())
        killed_at = time.monotonic()
        victim.kill()
        survivors_r = 2

        async def restored() -> bool:
            members = [m for m in await members_of(region) if m.agent_id != victim_id]
            if len(members) != 3:
                return False
            return placed(await region.holdings(), members, survivors_r, keys)

        await until(restored, 30, "every object back at 2 copies on its owners")
        restore_s = time.monotonic() - killed_at
        done.set()
        operations = await running
        after = copies(await region.holdings())
        # Only what the victim held moved (each of those gained exactly one agent).
        changed = {name for name in before if after[name] != before[name]}
        assert changed == lost, (changed - lost, lost - changed)
        for name in lost:
            assert len(after[name] - before[name]) == 1
        assert operations > 0 and not failures, failures[:5]
        print(
            f"restore after SIGKILL: {restore_s:.2f} s for {len(lost)} objects "
            f"({operations} reads+writes meanwhile, none failed)"
        )


async def test_join_takes_its_share_then_sigterm_drains_first(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    region.add(3)
    await region.wait_settled(3)
    keys = [f"j{i:03d}" for i in range(60)]
    async with AgentClient(region.agents[0].address) as client:
        await write(client, tmp_path / "v1", keys)
    before = copies(await region.holdings())

    # Join: the newcomer takes its share, and nothing moves between the others.
    (newcomer,) = region.add(1)
    new_id = region.agent_id(newcomer)
    await region.wait_members(4)
    members = await members_of(region)

    async def settled() -> bool:
        return placed(await region.holdings(), members, 2, keys)

    await until(settled, 30, "the newcomer holding its share")
    after = copies(await region.holdings())
    share = sum(1 for k in keys if new_id in after[(DATASET, k)])
    assert 60 * 2 / 4 * 0.5 < share < 60 * 2 / 4 * 1.6, share
    for name, where in after.items():
        assert where - before[name] <= {new_id}, name  # nothing moved between the old
    async with AgentClient(newcomer.address) as fresh:  # it owns some, routes the rest
        for k in keys[:10]:
            _, data = await fresh.get_bytes(DATASET, k)
            assert data.startswith(k.encode())
    shown = run_cli(["region", "show", "eu-west", "--output", "json"], region.env)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    check_output("region_show", doc)
    assert len(doc["agents"]) == 4 and all(a["alive"] for a in doc["agents"])

    # Leave: SIGTERM hands everything over before the agent exits.
    leaver: AgentProcess = region.agents[1]
    leaver_id = region.agent_id(leaver)
    assert leaver.stop() == 0
    assert leaver.event("drain_complete") is not None, leaver.log_tail()
    members = [m for m in await members_of(region) if m.agent_id != leaver_id]
    assert len(members) == 3
    # Right after its exit (no lease had to lapse) every object is on its new owners.
    assert placed(await region.holdings(), members, 2, keys)
    shown = run_cli(["region", "show", "eu-west", "--output", "json"], region.env)
    doc = json.loads(shown.stdout)
    check_output("region_show", doc)
    assert sorted(a["id"] for a in doc["agents"]) == sorted(m.agent_id for m in members)
    missing = run_cli(["region", "show", "nowhere"], region.env)
    assert missing.returncode != 0 and "nowhere" in missing.stderr


async def test_twice_the_weight_holds_twice_the_data(
    region: RegionOfAgents, tmp_path: Path
) -> None:
    # One copy per object (the region's setting): with r = 2 no agent can hold more than
    # one copy of each object, which caps a heavy agent's share (straw2's multi-pick
    # effect; the benchmark shows it for 16 agents).
    region.env = {**region.env, "MERIDIAN_REGION_COPIES": "eu-west=1"}
    region.add(1, weight=2)
    region.add(3)
    await region.wait_settled(4)
    heavy = region.agent_id(region.agents[0])
    keys = [f"w{i:03d}" for i in range(200)]
    async with AgentClient(region.agents[1].address) as client:
        await write(client, tmp_path / "v1", keys, size=4096)
    held = await region.holdings()
    assert sum(len(v) for v in held.values()) == 200  # one copy each
    # Each object on exactly the agent the weighted draw names for these agents' ids;
    # the share itself is judged over many keys, where the ids' luck evens out (200
    # keys put the heavy agent's share below 1.45x in about 2% of runs).
    members = await members_of(region)
    assert {m.agent_id: m.weight for m in members}[heavy] == 2
    for agent_id, objects in held.items():
        for dataset, key in objects:
            assert hrw.owners(dataset, key, members, 1)[0].agent_id == agent_id, key
    sample = [hrw.owners(DATASET, f"s{i}", members, 1)[0].agent_id for i in range(40_000)]
    share = sample.count(heavy) / (len(sample) - sample.count(heavy)) * 3
    assert 1.8 < share < 2.2, share
    shown = run_cli(["region", "show", "eu-west", "--output", "json"], region.env)
    doc = json.loads(shown.stdout)
    check_output("region_show", doc)
    weights = {a["id"]: a["weight"] for a in doc["agents"]}
    assert weights[heavy] == 2
