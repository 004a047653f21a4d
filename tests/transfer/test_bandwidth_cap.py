"""The dataset's transfer_bandwidth_bps caps a real Sync between two agents."""

from __future__ import annotations

import time

import pytest
from agents_inproc import AgentFactory, placement
from xfer_helpers import content, fetch

from controlplane.domain.placement import Placement

RATE = 4 << 20
SIZE = 8 << 20


@pytest.fixture
def placements() -> dict[str, Placement]:
    return {"capped": placement("capped", transfer_bandwidth_bps=float(RATE))}


async def test_a_sync_is_held_to_the_datasets_cap(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central")
    version = west.store.put("capped", "m", [content(SIZE)])

    begin = time.monotonic()
    got = await fetch(central.address, "capped", "m", version, [("eu-west", west.address)])
    elapsed = time.monotonic() - begin

    assert got.wire_bytes == SIZE
    # 2 s at the cap: the lower bound is what tests it; the upper one is loose for load
    assert 0.9 * SIZE / RATE <= elapsed <= 3 * SIZE / RATE
