"""SIGKILL of the sending agent (a real `meridian agent serve` process) in the middle of
a Sync: the sender
keeps no spool, so its restart makes the same delta again and skips what the
receiver holds; the receiver's next Fetch continues instead of starting over."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from agents_inproc import AgentFactory, placement
from harness.agent_process import AgentProcess
from killed_world import DATASET, RATE, slow_world
from waiting import WaitTimeoutError, until
from xfer_helpers import content, fetch, rewrite, transfers

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from meridian.v1 import agent_pb2

SIZE = 48 << 20  # the sender caps the link at RATE (its policy in etcd)
pytestmark = pytest.mark.integration


@pytest.fixture
def placements() -> dict[str, Placement]:
    return {DATASET: placement(DATASET, transfer_bandwidth_bps=float(RATE))}


async def test_sigkill_of_the_sender_mid_sync_then_the_receiver_resumes(
    agents: AgentFactory, tmp_path: Path, etcd_endpoint: str
) -> None:
    env = await asyncio.to_thread(slow_world, tmp_path / "world", etcd_endpoint)
    old = content(SIZE)
    new = rewrite(old, 0.5)
    root = tmp_path / "west"
    with ObjectStore(root, clock=HybridClock("eu-west")) as seeded:
        v1 = seeded.put(DATASET, "m", [old])
        v2 = seeded.put(DATASET, "m", [new])
    central = await agents("eu-central", checkpoint_bytes=1 << 20)
    central.store.apply(DATASET, "m", v1, [old])
    west = AgentProcess("eu-west", root, env, tmp_path / "west.log")
    await asyncio.to_thread(west.start)
    try:
        pending = asyncio.ensure_future(
            fetch(central.address, DATASET, "m", v2, [("eu-west", west.address)])
        )
        spool = central.root / "transfers"

        def under_way() -> bool:
            held = sum(p.stat().st_size for p in spool.glob("*.part"))
            return pending.done() or (held >= 4 << 20 and bool(list(spool.glob("*.json"))))

        # Not raised: past the bound the kill comes anyway, as it always did.
        with contextlib.suppress(WaitTimeoutError):
            await until(under_way, 30, what="the transfer to be under way, checkpointed")
        assert not pending.done(), "the transfer finished before the kill"
        west.kill()
        with pytest.raises(Exception):  # noqa: B017 - the sender died
            await pending
        await asyncio.to_thread(west.start)  # the same root, a new port
        got = await fetch(central.address, DATASET, "m", v2, [("eu-west", west.address)])
    finally:
        await asyncio.to_thread(west.kill)

    assert got.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.read_bytes(DATASET, "m") == new
    record = transfers(central.store)[-1]
    assert record["outcome"] == "completed"
    assert record["resumed_from"] >= 4 << 20
    assert record["wire_bytes"] < got.logical_bytes  # a delta, and only its rest
