"""The daemon's adopter (agents/daemon/agent.py `_adopter`): the takeover's pull of a
version another copy region holds asks for it with the set it was written in, so the
member is stored as one (and without a set when it was written in none)."""

from __future__ import annotations

from agents.daemon.agent import _adopter
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from meridian.v1 import agent_pb2

VERSION = Version.put(HLC(1_000, 0, "eu-west"), 1, Digest.of(b"x"))


class Transfers:
    def __init__(self) -> None:
        self.requests: list[agent_pb2.FetchRequest] = []

    async def fetch(self, request: agent_pb2.FetchRequest) -> agent_pb2.FetchResponse:
        self.requests.append(request)
        return agent_pb2.FetchResponse(outcome=agent_pb2.APPLY_OUTCOME_APPLIED)


async def test_the_pull_names_the_set_the_version_was_written_in() -> None:
    transfers = Transfers()
    adopt = _adopter(transfers)  # type: ignore[arg-type]
    assert await adopt("ckpt/a", "shard-0", VERSION, "eu-north", "n:1", "step-1")
    assert await adopt("ckpt/a", "plain", VERSION, "eu-north", "n:1", None)
    named, plain = transfers.requests
    assert named.HasField("set") and named.set == "step-1"
    assert not plain.HasField("set")
    assert [s.region for s in named.sources] == ["eu-north"]
