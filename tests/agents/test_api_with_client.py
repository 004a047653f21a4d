"""The servicer as the client library (agents/client.py) sees it: every call it makes
answers, and refusals come back as the Meridian error classes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_api_helpers import CRITICAL, REGION, STANDARD, US_ONLY, Agent, MiB

from agents.client import AgentClient
from agents.errors import ResidencyError
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.errors import NotFoundError


async def test_the_client_library_round_trips_through_the_servicer(
    agent: Agent, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt.bin"
    data = os.urandom(3 * MiB + 11)
    src.write_bytes(data)
    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        version = await client.put(STANDARD, "ckpt.bin", src)
        assert version.size == len(data)
        out = tmp_path / "back.bin"
        await client.get(STANDARD, "ckpt.bin", out)
        assert out.read_bytes() == data
        info = await client.stat(STANDARD, "ckpt.bin")
        assert info.version == version
        assert [o.key for o in await client.list(STANDARD)] == ["ckpt.bin"]
        member = await client.put(STANDARD, "set/a", src, set_id="s1")
        committed = await client.commit_set(STANDARD, "s1", {"set/a": member.hlc})
        shown = await client.get_set(STANDARD, "latest")
        assert shown.id == committed.id == "s1"
        health = await client.health()
        assert (health.live, health.region, health.objects) == (True, REGION, 2)
        await client.delete(STANDARD, "ckpt.bin")
        with pytest.raises(NotFoundError):
            await client.stat(STANDARD, "ckpt.bin")
        with pytest.raises(ResidencyError):
            await client.put(US_ONLY, "x", src)
        with pytest.raises(StaleEpochError):
            await client.put(CRITICAL, "x", src, epoch=1)
