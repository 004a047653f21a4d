"""Routing inside a region of real agents (issue 16): any agent takes any call, writes
are acked once r agents hold them, reads and listings cover the region."""

from __future__ import annotations

from pathlib import Path

import pytest
from region_harness import RegionOfAgents, copies

from agents.client import AgentClient
from agents.placement import Member, hrw

pytestmark = pytest.mark.integration


async def test_any_agent_takes_writes_and_reads(region: RegionOfAgents, tmp_path: Path) -> None:
    region.add(3)
    await region.wait_members(3)
    regs = await region.registrations()
    members = [Member(i, str(doc["endpoint"]), int(str(doc["weight"]))) for i, doc in regs.items()]
    a, b, _c = region.agents
    async with AgentClient(a.address) as ca, AgentClient(b.address) as cb:
        for i in range(12):
            src = tmp_path / f"in{i}"
            src.write_bytes(f"payload {i}".encode())
            await ca.put("corpus/a", f"k{i:02d}", src)
        held = copies(await region.holdings())
        assert len(held) == 12
        for i in range(12):
            owners = {m.agent_id for m in hrw.owners("corpus/a", f"k{i:02d}", members, 2)}
            assert held[("corpus/a", f"k{i:02d}")] == owners  # exactly the r owners, no other
        for i in range(12):  # read through another agent: one hop when it is no owner
            _, data = await cb.get_bytes("corpus/a", f"k{i:02d}")
            assert data == f"payload {i}".encode()
        listed = await cb.list("corpus/a")
        assert sorted(o.key for o in listed) == [f"k{i:02d}" for i in range(12)]
        await cb.delete("corpus/a", "k00")
        listed = await ca.list("corpus/a")
        assert "k00" not in {o.key for o in listed}
