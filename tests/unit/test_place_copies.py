"""`place_copies`: a write committed on an agent that no longer serves (leaving) still
reaches `r` serving agents; the committer counts as a copy only while it serves."""

from __future__ import annotations

from typing import Any

import pytest

from agents.placement.members import Member
from agents.routing.copies import place_copies
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import UnavailableError
from meridian.v1 import agent_pb2


class RecordingPeers:
    """Stands in for PeerStubs: every Fetch succeeds and is remembered by endpoint."""

    metadata = (("x-meridian-routed-by", "test"),)

    def __init__(self, down: frozenset[str] = frozenset()) -> None:
        self.fetched: list[str] = []
        self.down = down

    def stub(self, endpoint: str) -> Any:
        peers = self

        class Stub:
            async def Fetch(self, request: Any, **_: Any) -> agent_pb2.FetchResponse:  # noqa: N802
                if endpoint in peers.down:
                    raise UnavailableError(f"{endpoint} is down")
                peers.fetched.append(endpoint)
                return agent_pb2.FetchResponse()

        return Stub()


def member(agent_id: str) -> Member:
    return Member(agent_id, f"{agent_id}:1")


VERSION = Version.put(HLC(10, 0, "eu-west"), 3, Digest("blake3", "1" * 64))


async def place(peers: RecordingPeers, ranked: list[Member], r: int, self_id: str) -> list[str]:
    return await place_copies(
        peers,  # type: ignore[arg-type]
        ranked,
        r,
        self_id,
        "d",
        "k",
        VERSION,
        region="eu-west",
        source="self:1",
    )


async def test_a_serving_committer_counts_as_one_copy() -> None:
    peers = RecordingPeers()
    held = await place(peers, [member("a"), member("b"), member("c")], 2, "a")
    assert held == ["a", "b"] and peers.fetched == ["b:1"]


async def test_a_leaving_committer_does_not_count() -> None:
    # "l" committed the write but is leaving: not among the serving agents.
    peers = RecordingPeers()
    held = await place(peers, [member("b"), member("c"), member("d")], 2, "l")
    assert held == ["b", "c"] and peers.fetched == ["b:1", "c:1"]


async def test_with_no_agent_serving_the_committer_is_the_copy() -> None:
    # The whole region is stopping: every drain keeps its objects (drain_alone).
    peers = RecordingPeers()
    assert await place(peers, [], 1, "l") == ["l"] and peers.fetched == []


async def test_too_few_serving_agents_is_not_an_ack() -> None:
    peers = RecordingPeers(down=frozenset({"c:1"}))
    with pytest.raises(UnavailableError, match="committed on 1 of the 2"):
        await place(peers, [member("b"), member("c")], 2, "l")
