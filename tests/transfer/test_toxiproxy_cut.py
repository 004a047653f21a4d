"""Resume after a real cut: the Sync runs through the stack's Toxiproxy, whose
`limit_data` toxic closes the TCP connection half way; the next attempt continues,
and both together carry at most 1.1x the bytes of an uncut transfer."""

from __future__ import annotations

import pytest
from agents_inproc import AgentFactory
from harness.ports import free_port
from xfer_helpers import content, fetch, rewrite, transfers

from controlplane.adapters.toxiproxy import ToxiproxyClient
from meridian.v1 import agent_pb2

SIZE = 32 << 20


@pytest.mark.integration
@pytest.mark.parametrize("with_basis", [False, True], ids=["raw", "delta"])
async def test_a_sync_cut_by_toxiproxy_resumes(
    agents: AgentFactory, toxiproxy_url: str, with_basis: bool
) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central", checkpoint_bytes=1 << 20)
    old = content(SIZE)
    if with_basis:
        v1 = west.store.put("ckpt", "m", [old])
        await fetch(central.address, "ckpt", "m", v1, [("eu-west", west.address)])
    v2 = west.store.put("ckpt", "m", [rewrite(old, 0.5) if with_basis else old])
    # The uncut size: what the same transfer sends with nothing in the way.
    reference = await agents("eu-central", name="reference")
    if with_basis:
        await fetch(reference.address, "ckpt", "m", v1, [("eu-west", west.address)])
    uncut = (
        await fetch(reference.address, "ckpt", "m", v2, [("eu-west", west.address)])
    ).wire_bytes

    toxiproxy = ToxiproxyClient(toxiproxy_url)
    listen = f"127.0.0.1:{free_port()}"
    name = f"xfer-cut-{'delta' if with_basis else 'raw'}"
    toxiproxy.create_proxy(name, listen, west.address)
    try:
        toxiproxy.add_limit_data(name, uncut // 2)
        with pytest.raises(Exception, match=r"UNAVAILABLE|unavailable|ended"):
            await fetch(central.address, "ckpt", "m", v2, [("eu-west", listen)])
        toxiproxy.remove_toxics(name)
        resumed = await fetch(central.address, "ckpt", "m", v2, [("eu-west", listen)])
    finally:
        toxiproxy.delete_proxy(name)

    assert resumed.outcome == agent_pb2.APPLY_OUTCOME_APPLIED
    assert central.store.read_bytes("ckpt", "m") == west.store.read_bytes("ckpt", "m")
    failed, done = [r for r in transfers(central.store) if r["journal_hlc"] == v2.hlc.text][-2:]
    assert failed["outcome"] == "failed" and done["outcome"] == "completed"
    assert done["resumed_from"] > 0
    assert failed["wire_bytes"] + done["wire_bytes"] <= 1.1 * uncut
    assert done["wire_bytes"] < 0.8 * uncut  # the rest, not all of it again
