"""A routed `lowest` listing (agents/routing/service.py) merges the agents' newest
versions by the lowest; of two agents showing the same version, it shows the one whose
bytes were lost, so a proof (`dataset evict`, a tombstone's expiry) cannot count that
agent's copy as readable. Unit test: the local listing and the peers are faked."""

from __future__ import annotations

import pytest

from agents.placement.members import Member, Members
from agents.routing.service import RoutedAgentService
from meridian.v1 import agent_pb2

HLC_TEXT = "0000000001000-00000-eu-west"


def shown(key: str, *, missing: bool) -> agent_pb2.ObjectInfo:
    info = agent_pb2.ObjectInfo(key=key, missing=missing)
    info.version.hlc = HLC_TEXT
    return info


class TwoAgents(RoutedAgentService):
    """Only what a routed List touches: this agent's page and one peer's."""

    def __init__(self, here: agent_pb2.ListResponse, peer: agent_pb2.ListResponse) -> None:
        self.agent_id, self.region, self.roster = "a", "eu-west", None
        self.here, self.peer = here, peer

    async def _refuse_departed(self, what: str) -> None:
        return None

    async def _list(self, request: agent_pb2.ListRequest) -> agent_pb2.ListResponse:
        return self.here

    async def _remote_list(
        self, member: Member, request: agent_pb2.ListRequest, timeout_s: float
    ) -> agent_pb2.ListResponse:
        return self.peer


@pytest.mark.parametrize("lost_here", [True, False])
async def test_of_equal_versions_the_lowest_listing_shows_the_lost_copy(lost_here: bool) -> None:
    here = agent_pb2.ListResponse(objects=[shown("k", missing=lost_here)])
    peer = agent_pb2.ListResponse(objects=[shown("k", missing=not lost_here)])
    members = Members("eu-west", {i: Member(i, f"127.0.0.1:{n}") for n, i in enumerate("ab")})
    service = TwoAgents(here, peer)

    lowest = agent_pb2.ListRequest(dataset="d", complete=True, lowest=True)
    merged = await service._routed_list(members, lowest, 1.0)
    assert merged.lowest and [(o.key, o.missing) for o in merged.objects] == [("k", True)]
    # By the highest (what readers are routed by), either copy may stand for it.
    highest = agent_pb2.ListRequest(dataset="d", complete=True)
    assert [o.key for o in (await service._routed_list(members, highest, 1.0)).objects] == ["k"]
