"""A Fetch of a set member older than its key's newest here (agents/transfer/service.py,
ObjectStore.wanted): stored, under the newest, while a set recorded here names exactly
that version and is not complete; refused by LWW otherwise. A takeover's adoption of a
set (agents/replication/sync.py, `_adopt_set`) records the set, then fetches its
members: before this, a new owner holding the next checkpoint's put of a member could
never complete the set it adopted."""

from __future__ import annotations

import pytest
from agents_inproc import AgentFactory
from xfer_helpers import fetch

from agents.daemon.agent import _adopter
from controlplane.errors import NotFoundError
from meridian.v1 import agent_pb2

DS = "ckpt"


async def test_an_older_member_is_fetched_for_its_recorded_set_only(
    agents: AgentFactory,
) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central")
    member = west.store.put(DS, "shard-0", [b"step 1, shard 0"], set_id="step-1")
    record = west.store.commit_set(DS, "step-1", {"shard-0": member.hlc})
    source = [("eu-west", west.address)]
    # The next checkpoint's put of the key, newer, is held here already.
    central.store.clock.observe(record.hlc)
    newer = central.store.put(DS, "shard-0", [b"step 2, shard 0"], set_id="step-2")
    assert newer.hlc > member.hlc

    # No set names it here, or one not recorded here: refused by LWW, nothing stored.
    refused = await fetch(central.address, DS, "shard-0", member, source)
    assert refused.outcome == agent_pb2.APPLY_OUTCOME_OLDER
    unknown = await fetch(central.address, DS, "shard-0", member, source, set_id="step-1")
    assert unknown.outcome == agent_pb2.APPLY_OUTCOME_OLDER
    with pytest.raises(NotFoundError):
        central.store.stat(DS, "shard-0", member.hlc)

    # Recorded here, incomplete: the member is taken for it, and the key's newest
    # stays its head.
    central.store.apply_set(DS, "step-1", record.hlc, record.members)
    with pytest.raises(NotFoundError):
        central.store.get_set(DS, "latest")
    taken = await fetch(central.address, DS, "shard-0", member, source, set_id="step-1")
    assert taken.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.head(DS, "shard-0") == newer
    assert central.store.read_bytes(DS, "shard-0", member.hlc) == b"step 1, shard 0"
    shown = central.store.get_set(DS, "latest")
    assert (shown.set_id, shown.members) == ("step-1", {"shard-0": member.hlc})


async def test_the_takeover_s_adopt_port_stores_an_older_member_for_its_set(
    agents: AgentFactory,
) -> None:
    """The daemon's adopt port (agents/daemon/agent.py, `_adopter`), as a takeover pass
    calls it once the set is recorded: a Fetch naming the set, answered as taken."""
    west = await agents("eu-west")
    central = await agents("eu-central")
    member = west.store.put(DS, "shard-1", [b"step 1, shard 1"], set_id="step-1")
    record = west.store.commit_set(DS, "step-1", {"shard-1": member.hlc})
    central.store.clock.observe(record.hlc)
    newer = central.store.put(DS, "shard-1", [b"step 2, shard 1"], set_id="step-2")
    central.store.apply_set(DS, "step-1", record.hlc, record.members)
    adopt = _adopter(central.service)
    assert await adopt(DS, "shard-1", member, "eu-west", west.address, "step-1")
    assert central.store.head(DS, "shard-1") == newer
    assert central.store.get_set(DS, "latest").set_id == "step-1"
