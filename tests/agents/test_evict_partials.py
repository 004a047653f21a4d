"""An agent's `Evict` drops the partial pulls of the keys it forgot, and only those: a
key it keeps (written there since the proof) keeps its cut pull too. In-process agent
(a real store, an in-memory policy) on a loopback port; the transfer service is a
fake port recording what it is asked to drop."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agent_api_helpers import REGIONS, STANDARD, standard, start_agent, stop_agent
from fakes.admission import compiled

from agents.client import AgentClient


class Partials:
    """The part of the transfer service `Evict` uses: what it was asked to drop."""

    def __init__(self) -> None:
        self.dropped: list[tuple[str, dict[str, str]]] = []

    def drop_evicted(self, dataset: str, evicted: Mapping[str, str]) -> int:
        self.dropped.append((dataset, dict(evicted)))
        return len(evicted)


async def test_only_the_forgotten_keys_partial_pulls_are_dropped(tmp_path: Path) -> None:
    agent = await start_agent(tmp_path / "agent")
    try:
        partials = Partials()
        agent.service.transfers = partials  # type: ignore[assignment]
        gone = agent.store.put(STANDARD, "gone", [b"proven elsewhere"])
        proven = agent.store.put(STANDARD, "kept", [b"proven elsewhere"])
        agent.store.put(STANDARD, "kept", [b"written here since the proof"])
        # The policy now places the dataset in us-east alone: eu-west may evict it.
        agent.policy.current = compiled(REGIONS, [standard(STANDARD, ("US",), "us-east")], 2)
        async with AgentClient(f"127.0.0.1:{agent.port}") as client:
            done = await client.evict(STANDARD, [("gone", gone.hlc), ("kept", proven.hlc)])
        assert done.objects == 1 and [k.key for k in done.kept] == ["kept"]
        assert partials.dropped == [(STANDARD, {"gone": gone.hlc.text})]
    finally:
        await stop_agent(agent)
