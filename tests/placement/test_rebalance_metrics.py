"""The rebalance's Prometheus series (issue 16): a join moves every copy to the newcomer
(r = 2 in a region of two) and the agent that pushed them counts exactly those."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator

import pytest
from harness.agent_process import AgentProcess
from region_harness import RegionOfAgents, until

from agents.client import AgentClient

pytestmark = pytest.mark.integration

DATASET = "corpus/b"
SIZE = 2048


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def sample(proc: AgentProcess, name: str, labels: str = "") -> float:
    wanted = f"{name}{{{labels}}}" if labels else name
    url = f"http://{proc.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{wanted} is not exposed by {proc.metrics_address}")


async def test_a_join_is_counted_by_the_agent_that_moved_the_copies(
    region: RegionOfAgents,
) -> None:
    (first,) = region.add(1, metrics=True)
    await region.wait_members(1)
    keys = [f"m{i:03d}" for i in range(30)]
    async with AgentClient(first.address) as client:
        for key in keys:
            await client.put(DATASET, key, chunks(key.encode().ljust(SIZE, b".")))
    assert sample(first, "meridian_rebalance_moved_objects_total") == 0
    # The agent's passes at start and at its registration settle too, moving nothing.
    settled_before = sample(first, "meridian_rebalance_passes_total", 'outcome="settled"')

    (newcomer,) = region.add(1, metrics=True)
    new_id = region.agent_id(newcomer)
    await region.wait_members(2)

    async def newcomer_holds_all() -> bool:
        held = (await region.holdings()).get(new_id, {})
        return sum(1 for (ds, _k) in held if ds == DATASET) == len(keys)

    await until(newcomer_holds_all, 60, "the newcomer holding a copy of every object")

    def settled() -> bool:
        # The newcomer lists the copies before the pass that moved them has ended (it
        # counts them once the whole answer is back, and times itself at its end).
        passes = sample(first, "meridian_rebalance_passes_total", 'outcome="settled"')
        timed = sample(first, "meridian_rebalance_pass_seconds_count")
        return passes > settled_before and timed >= 1

    await until(lambda: asyncio.to_thread(settled), 30, "the join's pass to settle")
    assert sample(first, "meridian_rebalance_moved_objects_total") == len(keys)
    assert sample(first, "meridian_rebalance_moved_bytes_total") == len(keys) * SIZE
    assert sample(first, "meridian_rebalance_remaining_objects") == 0
    assert sample(first, "meridian_rebalance_copy_failures_total") == 0
    assert sample(first, "meridian_rebalance_pass_seconds_count") >= 1
    assert sample(newcomer, "meridian_rebalance_handed_off_total") == 0
