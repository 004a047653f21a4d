"""`meridian dataset evict`'s edges (controlplane/coordination/orchestration/evict.py)
that the integration tests do not reach: a route map that sends every agent of the
region to one address is refused; a placement region with no agent registered stops
the proof, naming it; an agent that fails mid-run is reported with what it did before,
the others are still asked, and the run counts as failed (the CLI exits 1); a proof
reads each placement region's agents once, for its listing and its expiry clock; a
policy applied while the operator confirms, or during the second proof, refuses the
run before any agent is asked.
Unit test: etcd in memory, the agents faked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
from fakes.admission import compiled
from fakes.agent_client import FakeAgentClient, register_agents
from fakes.coordination import MemoryCoordination
from placements import critical

from agents.client import Health, ObjectInfo
from controlplane.coordination.orchestration import evict
from controlplane.coordination.orchestration.evict import Eviction
from controlplane.coordination.protocols import keys
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Version
from controlplane.errors import RefusedError, UnavailableError
from controlplane.ports.coordination import KeyValue
from meridian.v1 import agent_pb2

PLACEMENT = critical("ckpt/a", replicas=("eu-central",))
KEYS = [(f"k{i}", HLC(1_000 + i, 0, "eu-west")) for i in range(3)]


async def registered(agents: dict[str, tuple[str, str]]) -> MemoryCoordination:
    """agent id -> (region, endpoint), registered as agents register."""
    return await register_agents(MemoryCoordination(), agents)


async def test_a_route_map_that_sends_the_regions_agents_to_one_address_is_refused() -> None:
    coord = await registered({"n1": ("eu-north", "n:1"), "n2": ("eu-north", "n:2")})
    assert await evict._agents(coord, lambda _r, a: a, "eu-north") == ["n:1", "n:2"]
    with pytest.raises(RefusedError, match="one address for its 2 agents"):
        await evict._agents(coord, lambda _r, _a: "proxy:9", "eu-north")


async def test_a_placement_region_with_no_agent_stops_the_proof_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coord = await registered({"w1": ("eu-west", "w:1"), "n1": ("eu-north", "n:1")})
    listed: list[str] = []

    async def listing(
        address: str, dataset: str, timeout_s: float, *, lowest: bool
    ) -> dict[str, ObjectInfo]:
        listed.append(address)
        return {}

    monkeypatch.setattr(evict, "_listing", listing)
    with pytest.raises(UnavailableError, match="region eu-central of the placement has no agent"):
        await evict._prove(coord, lambda _r, a: a, PLACEMENT, "eu-north", ["n:1"], 1.0)
    assert listed == ["n:1", "w:1"]  # eu-west listed; eu-central could not be


class Agent(FakeAgentClient):
    """Answers `fail_at - 1` pages (one object each), then fails."""

    calls: ClassVar[dict[str, int]] = {}
    fail_at: ClassVar[dict[str, int]] = {}

    async def evict(
        self,
        dataset: str,
        keys: list[tuple[str, HLC]],
        sets: list[tuple[str, str]],
        *,
        placement_digest: str = "",
    ) -> agent_pb2.EvictResponse:
        n = Agent.calls[self.address] = Agent.calls.get(self.address, 0) + 1
        if n == Agent.fail_at.get(self.address):
            raise UnavailableError(f"{self.address} is gone")
        return agent_pb2.EvictResponse(objects=len(keys), versions=len(keys), bytes=10)


async def test_an_agent_failing_mid_run_is_reported_and_the_others_still_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(evict, "AgentClient", Agent)
    monkeypatch.setattr(evict, "EVICT_PAGE", 1)
    monkeypatch.setattr(evict, "EVICT_ATTEMPTS", 1)  # the failure lasts
    Agent.calls.clear()
    Agent.fail_at.clear()
    Agent.fail_at["n:1"] = 2
    plan = Eviction("ckpt/a", "eu-north", list(KEYS), [], [], dry_run=False)
    pages: list[str] = []
    for endpoint in ("n:1", "n:2"):
        plan.agents.append(await evict._evict_at(endpoint, plan, 1.0, pages.append))
    first, second = plan.agents
    assert (first.objects, first.error) == (1, "n:1 is gone")  # its first page counted
    assert (second.objects, second.error) == (3, None)
    assert Agent.calls == {"n:1": 2, "n:2": 3}
    assert plan.failed and plan.as_json()["agents"] == plan.agent_rows()
    assert pages[0] == "n:1: 1/3 objects asked, 1 forgotten"


class CountingCoordination(MemoryCoordination):
    def __init__(self) -> None:
        super().__init__()
        self.prefixes: list[str] = []

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self.prefixes.append(prefix)
        return await super().get_prefix(prefix)


class Healthy(FakeAgentClient):
    """Every agent answers Health with its id (its address here) and a retention."""

    async def health(self) -> Health:
        return Health(True, "r", self.address, 0, 0, 0, 1_000, 5_000)


async def test_a_proof_reads_each_placement_regions_agents_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agents asked for the expiry clock are the ones whose listing is used: one read
    of each region's registrations serves both."""
    coord = CountingCoordination()
    await register_agents(coord, {"w:1": ("eu-west", "w:1"), "c:1": ("eu-central", "c:1")})
    tombstone = ObjectInfo("ckpt/a", "k", Version.delete(HLC(1_000, 0, "eu-west")))
    listed: list[str] = []

    async def listing(
        address: str, dataset: str, timeout_s: float, *, lowest: bool
    ) -> dict[str, ObjectInfo]:
        listed.append(address)
        return {"k": tombstone} if address == "n:1" else {}

    async def no_sets(*_args: object) -> list[tuple[str, str]]:
        return []

    def clock() -> float:
        listed.append("clock")
        return 10.0  # this host's: later than the agents' (5 s), so theirs is used

    monkeypatch.setattr(evict, "_listing", listing)
    monkeypatch.setattr(evict, "_proven_sets", no_sets)
    monkeypatch.setattr(evict, "AgentClient", Healthy)
    monkeypatch.setattr(evict, "time", SimpleNamespace(time=clock))  # evict's clock only
    plan = await evict._prove(coord, lambda _r, a: a, PLACEMENT, "eu-north", ["n:1"], 1.0)
    assert sorted(coord.prefixes) == sorted(keys.agents_of(r) for r in PLACEMENT.regions)
    # The "now" an absence is judged by is read before the placement's listings show it.
    assert listed == ["n:1", "clock", "clock", "w:1", "c:1"]
    # The delete is older than the agents' retention by their clock: shown held.
    assert plan.evictable == [("k", tombstone.version.hlc)]


@pytest.mark.parametrize(
    ("applied_at", "why"),
    [(1, "changed while the eviction was confirmed"), (2, "changed during the proof")],
    ids=["while-confirming", "during-the-second-proof"],
)
async def test_a_policy_applied_meanwhile_refuses_the_run_before_any_agent_is_asked(
    monkeypatch: pytest.MonkeyPatch, applied_at: int, why: str
) -> None:
    coord = await registered({"n1": ("eu-north", "n:1")})
    regions = dict.fromkeys(("eu-west", "eu-central", "eu-north"), "EU")
    await coord.put(keys.POLICY_CURRENT, compiled(regions, [PLACEMENT]).to_json())
    # Another placement that still leaves eu-north out: only its digest differs.
    other = critical("ckpt/a", replicas=("eu-central",), ack="all")
    proofs = 0

    async def apply_other() -> None:
        await coord.put(keys.POLICY_CURRENT, compiled(regions, [other], revision=2).to_json())

    async def prove(*_args: object) -> Eviction:
        nonlocal proofs
        proofs += 1
        if proofs == 2 and applied_at == 2:
            await apply_other()
        return Eviction("ckpt/a", "eu-north", list(KEYS), [], [], dry_run=False)

    async def confirm(_plan: Eviction) -> bool:
        if applied_at == 1:
            await apply_other()
        return True

    monkeypatch.setattr(evict, "_prove", prove)
    monkeypatch.setattr(evict, "AgentClient", Agent)
    Agent.calls.clear()
    with pytest.raises(RefusedError, match=why):
        await evict.evict_dataset(
            coord, lambda _r, a: a, "ckpt/a", "eu-north", dry_run=False, confirm=confirm
        )
    assert Agent.calls == {}  # nothing was dropped anywhere
