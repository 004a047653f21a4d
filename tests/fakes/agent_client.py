"""Stand-ins for the agents in unit tests of code that opens one `AgentClient` per agent
address (`meridian dataset evict`): a fake client to subclass with the calls a test
answers, and agents registered in an in-memory etcd as real agents register."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from controlplane.coordination.protocols import keys
from fakes.coordination import MemoryCoordination


class FakeAgentClient:
    """`async with FakeAgentClient(address, timeout_s=...)`, as `AgentClient` is opened;
    subclasses add the calls they answer."""

    def __init__(self, address: str, *, timeout_s: float = 0.0) -> None:
        self.address = address

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


async def register_agents(
    coord: MemoryCoordination, agents: Mapping[str, tuple[str, str]]
) -> MemoryCoordination:
    """Register each agent (id -> (region, endpoint)) in `coord`; returns it."""
    for agent_id, (region, endpoint) in agents.items():
        await coord.put(keys.agent(region, agent_id), json.dumps({"endpoint": endpoint}).encode())
    return coord
