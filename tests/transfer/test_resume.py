"""A Sync cut in the middle continues from what the receiver durably holds: the
second attempt sends only the rest, so both together send at most 1.1x an uncut
transfer; raw (no basis) and delta (with a basis) alike."""

from __future__ import annotations

import os

import pytest
from agents_inproc import Agent, AgentFactory
from xfer_helpers import content, fetch, rewrite, transfers
from xfer_relay import Relay

from controlplane.domain.version import Version
from meridian.v1 import agent_pb2

SIZE = 24 << 20


async def _pair(agents: AgentFactory, with_basis: bool, tag: str) -> tuple[Agent, Agent, Version]:
    west = await agents("eu-west", name=f"{tag}-west")
    central = await agents("eu-central", name=f"{tag}-central", checkpoint_bytes=1 << 20)
    old = content(SIZE)
    if with_basis:
        v1 = west.store.put("ckpt", "m", [old])
        await fetch(central.address, "ckpt", "m", v1, [("eu-west", west.address)])
    v2 = west.store.put("ckpt", "m", [rewrite(old, 0.5) if with_basis else old])
    return west, central, v2


@pytest.mark.parametrize("with_basis", [False, True], ids=["raw", "delta"])
async def test_a_cut_sync_resumes_and_sends_at_most_a_tenth_more(
    agents: AgentFactory, with_basis: bool
) -> None:
    ref_west, ref_central, ref_v2 = await _pair(agents, with_basis, "uncut")
    uncut = await fetch(ref_central.address, "ckpt", "m", ref_v2, [("eu-west", ref_west.address)])
    west, central, v2 = await _pair(agents, with_basis, "cut")
    relay = await Relay(west.address, cut_after_bytes=uncut.wire_bytes // 2).start()
    try:
        with pytest.raises(Exception, match="relay cut the stream"):
            await fetch(central.address, "ckpt", "m", v2, [("eu-west", relay.address)])
        assert list((central.root / "transfers").glob("*.json"))  # a resume state
        resumed = await fetch(central.address, "ckpt", "m", v2, [("eu-west", relay.address)])
    finally:
        await relay.stop()

    assert resumed.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.read_bytes("ckpt", "m") == west.store.read_bytes("ckpt", "m")
    first, second = relay.passed
    assert first >= uncut.wire_bytes // 2 - (1 << 20)  # the cut came about half way
    assert second < uncut.wire_bytes * 0.6  # the rest, not all of it again
    assert first + second <= 1.1 * uncut.wire_bytes
    record = transfers(central.store)[-1]
    assert record["outcome"] == "completed"
    assert record["resumed_from"] > 0
    assert record["wire_bytes"] == resumed.wire_bytes == second
    assert not list((central.root / "transfers").iterdir())  # the state went with the commit


async def test_a_partial_shorter_than_its_state_resumes_from_what_the_file_holds(
    agents: AgentFactory,
) -> None:
    """The state names bytes the file no longer has (a restored disk, a hand edit): the
    sender is asked for what follows the file, so the rest fills no gap."""
    west, central, v2 = await _pair(agents, False, "short")
    relay = await Relay(west.address, cut_after_bytes=SIZE // 2).start()
    try:
        with pytest.raises(Exception, match="relay cut the stream"):
            await fetch(central.address, "ckpt", "m", v2, [("eu-west", relay.address)])
        [partial] = (central.root / "transfers").glob("*.part")
        kept = partial.stat().st_size // 2
        assert kept > 0
        os.truncate(partial, kept)
        resumed = await fetch(central.address, "ckpt", "m", v2, [("eu-west", relay.address)])
    finally:
        await relay.stop()
    assert resumed.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.read_bytes("ckpt", "m") == west.store.read_bytes("ckpt", "m")
    record = transfers(central.store)[-1]
    assert record["outcome"] == "completed"
    assert record["resumed_from"] == kept
