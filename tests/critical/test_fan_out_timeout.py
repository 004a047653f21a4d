"""A routed List, GetSet or Rewind (a takeover proof's, agents/routing/service.py) gives
each peer what is left of the caller's deadline, at most 30 s, and 30 s when the caller
set none; a routed GetSet's peers get what its local read left. Unit tests: the servicer
context is faked (only its `time_remaining`), and so is the servicer's store read."""

from __future__ import annotations

from typing import cast

import pytest

from agents.placement.members import Member, Members
from agents.routing import service as routing_service
from agents.routing.service import FAN_OUT_TIMEOUT_S, RoutedAgentService, fan_out_timeout
from agents.service.outcome import Context
from controlplane.errors import NotFoundError
from meridian.v1 import agent_pb2


class Remaining:
    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [(2.5, 2.5), (None, FAN_OUT_TIMEOUT_S), (3600.0, FAN_OUT_TIMEOUT_S), (-1.0, 0.0)],
)
def test_a_peer_gets_what_is_left_of_the_callers_deadline(
    remaining: float | None, expected: float
) -> None:
    assert fan_out_timeout(cast(Context, Remaining(remaining))) == expected


class Clock:
    """The routing module's `time`, whose monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class SlowHere(RoutedAgentService):
    """Only what a routed GetSet touches: a local read that takes `LOCAL_S` on `clock`,
    and peers that record the timeout they were given. Both answer "not found"."""

    def __init__(self, clock: Clock) -> None:  # the servicer's parts are not used
        self.agent_id, self.region, self.roster = "a", "eu-west", None
        self.clock = clock
        self.given: list[float] = []

    async def _get_set(self, request: agent_pb2.GetSetRequest) -> agent_pb2.GetSetResponse:
        self.clock.now += LOCAL_S
        raise NotFoundError("not here")

    async def _remote_get_set(
        self, member: Member, request: agent_pb2.GetSetRequest, timeout_s: float
    ) -> agent_pb2.GetSetResponse:
        self.given.append(timeout_s)
        raise NotFoundError("not there")


LOCAL_S = 0.3


async def test_a_routed_get_set_gives_peers_what_the_local_read_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(routing_service, "time", clock)
    service = SlowHere(clock)
    members = Members("eu-west", {i: Member(i, f"127.0.0.1:{n}") for n, i in enumerate("abc")})
    with pytest.raises(NotFoundError):
        await service._routed_get_set(members, agent_pb2.GetSetRequest(dataset="d", set="s"), 1.0)
    assert len(service.given) == 2  # b and c, not itself
    assert service.given == [pytest.approx(1.0 - LOCAL_S)] * 2
