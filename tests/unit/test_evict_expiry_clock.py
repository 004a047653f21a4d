"""`_expiry_clock` (controlplane/coordination/orchestration/evict.py): the retention and
clock an expired delete is judged by come from every agent of the placement, the
longest retention and the earliest clock; unknown (None: nothing counts as expired)
when an agent predates saying them, or a route map sends one agent's call to another.
Unit test: etcd in memory, the agents' Health answers faked."""

from __future__ import annotations

import pytest
from fakes.agent_client import FakeAgentClient, register_agents
from fakes.coordination import MemoryCoordination
from placements import critical

from agents.client import Health
from controlplane.coordination.orchestration import evict

PLACEMENT = critical("ckpt/a", replicas=("eu-central",))
ANSWERS: dict[str, Health] = {}


def health(agent_id: str, retention_ms: int | None, now_ms: int | None) -> Health:
    return Health(True, "r", agent_id, 0, 0, 0, retention_ms, now_ms)


class FakeClient(FakeAgentClient):
    async def health(self) -> Health:
        return ANSWERS[self.address]


async def registered(agents: dict[str, tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """agent id -> (region, endpoint), registered as agents register, then read back as
    the proof reads them: (agent id, endpoint) by placement region."""
    coord = await register_agents(MemoryCoordination(), agents)
    return {r: await evict._registrations(coord, r) for r in PLACEMENT.regions}


def direct(_region: str, address: str) -> str:
    return address


@pytest.fixture(autouse=True)
def fake_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evict, "AgentClient", FakeClient)
    ANSWERS.clear()


async def test_the_longest_retention_and_the_earliest_clock_of_every_agent() -> None:
    agents = await registered(
        {"w1": ("eu-west", "w:1"), "w2": ("eu-west", "w:2"), "c1": ("eu-central", "c:1")}
    )
    ANSWERS.update(
        {
            "w:1": health("w1", 1_000, 9_000),
            "w:2": health("w2", 5_000, 8_000),
            "c:1": health("c1", 2_000, 7_000),
        }
    )
    assert await evict._expiry_clock(direct, PLACEMENT, agents, 1.0) == (5_000, 7_000)


async def test_an_agent_that_predates_saying_it_makes_it_unknown() -> None:
    agents = await registered({"w1": ("eu-west", "w:1"), "c1": ("eu-central", "c:1")})
    ANSWERS.update({"w:1": health("w1", 1_000, 9_000), "c:1": health("c1", None, None)})
    retention, _ = await evict._expiry_clock(direct, PLACEMENT, agents, 1.0)
    assert retention is None


async def test_a_proxy_that_answers_for_another_agent_makes_it_unknown() -> None:
    agents = await registered({"w1": ("eu-west", "w:1"), "w2": ("eu-west", "w:2")})
    ANSWERS.update({"proxy:9": health("w1", 1_000, 9_000)})
    retention, _ = await evict._expiry_clock(lambda _r, _a: "proxy:9", PLACEMENT, agents, 1.0)
    assert retention is None  # w2's call reached w1: w2's retention is not known


async def test_a_region_with_no_agent_registered_makes_it_unknown() -> None:
    """A retention of 0 (nobody asked) would count every delete expired."""
    agents = await registered({"w1": ("eu-west", "w:1")})  # eu-central: nobody
    ANSWERS.update({"w:1": health("w1", 1_000, 9_000)})
    retention, _ = await evict._expiry_clock(direct, PLACEMENT, agents, 1.0)
    assert retention is None
