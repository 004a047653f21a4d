"""Fixtures of the agent API tests: one in-process agent per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_api_helpers import Agent, start_agent, stop_agent


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    running = await start_agent(tmp_path / "root")
    try:
        yield running
    finally:
        await stop_agent(running)
