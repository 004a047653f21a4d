"""SIGKILL of the receiving agent (a real `meridian agent serve` process) in the middle
of a patch: its old version stays readable and intact, the restart repairs the store,
and the next Fetch continues from what the killed one had made durable."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from agents_inproc import AgentFactory, placement
from harness.agent_process import AgentProcess
from harness.ports import free_port
from killed_world import DATASET, RATE, slow_world
from waiting import WaitTimeoutError, until
from xfer_helpers import content, fetch, rewrite, transfers

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from meridian.v1 import agent_pb2

SIZE = 48 << 20  # at the link cap (RATE) the delta takes seconds: time to kill in it
pytestmark = pytest.mark.integration


@pytest.fixture
def placements() -> dict[str, Placement]:
    return {DATASET: placement(DATASET, transfer_bandwidth_bps=float(RATE))}


async def test_sigkill_of_the_receiver_mid_patch_keeps_the_old_version_and_resumes(
    agents: AgentFactory, tmp_path: Path, etcd_endpoint: str
) -> None:
    env = await asyncio.to_thread(slow_world, tmp_path / "world", etcd_endpoint)
    west = await agents("eu-west")
    old = content(SIZE)
    # ~78 % rewritten: a ~38 MiB delta, seconds past the agent's first checkpoint (at
    # 16 MiB, not settable) at the link cap; at 0.5 only ~4 MiB were left after it.
    new = rewrite(old, 1.5)
    v1 = west.store.put(DATASET, "m", [old])
    v2 = west.store.put(DATASET, "m", [new])
    root = tmp_path / "central"
    with ObjectStore(root, clock=HybridClock("eu-central")) as seeded:
        seeded.apply(DATASET, "m", v1, [old])  # the receiver holds the old version
    # The transfer record is read from the receiver's journal below, so its recorder must
    # not ship it (shipped records leave the journal): a catalog that never answers.
    # With the real one it raced the stop (its idle interval is 0.5 s) and lost under load.
    unreachable = f"postgresql+psycopg://meridian@127.0.0.1:{free_port()}/none"
    central_env = {**env, "MERIDIAN_CATALOG": unreachable}
    central = AgentProcess("eu-central", root, central_env, tmp_path / "central.log")
    await asyncio.to_thread(central.start)
    try:
        pending = asyncio.ensure_future(
            fetch(central.address, DATASET, "m", v2, [("eu-west", west.address)])
        )
        spool = root / "transfers"

        def under_way() -> bool:
            held = sum(p.stat().st_size for p in spool.glob("*.part")) if spool.exists() else 0
            return pending.done() or (held >= 8 << 20 and bool(list(spool.glob("*.json"))))

        # Not raised: past the bound the kill comes anyway, as it always did.
        with contextlib.suppress(WaitTimeoutError):
            await until(under_way, 30, what="the transfer to be under way, checkpointed")
        assert not pending.done(), "the transfer finished before the kill"
        central.kill()
        with pytest.raises(Exception):  # noqa: B017 - the call dies with its server
            await pending
    finally:
        central.kill()

    with ObjectStore(root, clock=HybridClock("eu-central")) as after:
        assert after.head(DATASET, "m") == v1
        assert after.read_bytes(DATASET, "m") == old  # the old version, whole
    await asyncio.to_thread(central.start)  # the same root: startup repair, then serving
    try:
        got = await fetch(central.address, DATASET, "m", v2, [("eu-west", west.address)])
    finally:
        await asyncio.to_thread(central.stop)
    assert got.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    with ObjectStore(root, clock=HybridClock("eu-central")) as done:
        assert done.read_bytes(DATASET, "m") == new
        record = transfers(done)[-1]
    assert record["outcome"] == "completed"
    assert record["resumed_from"] >= 8 << 20  # it continued, it did not start over
