"""SIGKILL of the sending agent (a real process) in the middle of a Sync: the sender
keeps no spool, so its restart makes the same delta again and skips what the
receiver holds; the receiver's next Fetch continues instead of starting over."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from agent_proc import AgentProc, write_policy
from agents_inproc import REGIONS, AgentFactory, placement
from xfer_helpers import content, fetch, rewrite, transfers

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from meridian.v1 import agent_pb2

SIZE = 48 << 20
RATE = 6 << 20


@pytest.fixture
def placements() -> dict[str, Placement]:
    return {"slow": placement("slow", transfer_bandwidth_bps=float(RATE))}


async def test_sigkill_of_the_sender_mid_sync_then_the_receiver_resumes(
    agents: AgentFactory, placements: dict[str, Placement], tmp_path: Path
) -> None:
    old = content(SIZE)
    new = rewrite(old, 0.5)
    root = tmp_path / "west"
    with ObjectStore(root, clock=HybridClock("eu-west")) as seeded:
        v1 = seeded.put("slow", "m", [old])
        v2 = seeded.put("slow", "m", [new])
    central = await agents("eu-central", checkpoint_bytes=1 << 20)
    central.store.apply("slow", "m", v1, [old])
    policy = write_policy(tmp_path / "policy.json", REGIONS, list(placements.values()))
    west = AgentProc(root, "eu-west", policy, tmp_path / "west.log").start()
    try:
        pending = asyncio.ensure_future(
            fetch(central.address, "slow", "m", v2, [("eu-west", west.address)])
        )
        spool = central.root / "transfers"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pending.done():
            held = sum(p.stat().st_size for p in spool.glob("*.part"))
            if held >= 4 << 20 and list(spool.glob("*.json")):
                break
            await asyncio.sleep(0.05)
        assert not pending.done(), "the transfer finished before the kill"
        west.kill()
        with pytest.raises(Exception):  # noqa: B017 - the sender died
            await pending
        west.start()
        got = await fetch(central.address, "slow", "m", v2, [("eu-west", west.address)])
    finally:
        west.kill()

    assert got.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.read_bytes("slow", "m") == new
    record = transfers(central.store)[-1]
    assert record["outcome"] == "completed"
    assert record["resumed_from"] >= 4 << 20
    assert record["wire_bytes"] < got.logical_bytes  # a delta, and only its rest
