"""Fixtures of the transfer tests: agents in this process (agents_inproc.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agents_inproc import Agent, AgentFactory, placement, start_agent

from controlplane.domain.placement import Placement


@pytest.fixture
def placements() -> dict[str, Placement]:
    return {
        "ckpt": placement("ckpt"),
        "crit": placement("crit", dataset_class="critical", ack="quorum"),
    }


@pytest.fixture
async def agents(tmp_path: Path, placements: dict[str, Placement]) -> AsyncIterator[AgentFactory]:
    started: list[Agent] = []

    async def factory(region: str, **kwargs: object) -> Agent:
        name = kwargs.pop("name", region)
        agent = await start_agent(tmp_path / str(name), region, placements, **kwargs)  # type: ignore[arg-type]
        started.append(agent)
        return agent

    yield factory
    for agent in reversed(started):
        await agent.stop()
