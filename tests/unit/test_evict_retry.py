"""`_evict_page` (controlplane/coordination/orchestration/evict.py): a page an agent
refuses as unavailable (its policy watch lagging the placement the proof was made
under) is asked again, a bounded number of times; a refusal, or a timeout, is not.
Unit test: the agent client is faked."""

from __future__ import annotations

import pytest

from controlplane.coordination.orchestration import evict
from controlplane.coordination.orchestration.evict import EVICT_ATTEMPTS, Eviction
from controlplane.domain.hlc import HLC
from controlplane.errors import (
    MeridianError,
    OperationTimeoutError,
    RefusedError,
    UnavailableError,
)
from meridian.v1 import agent_pb2

PAGE = [("k", HLC(1_000, 0, "eu-west"))]


class Agent:
    """Refuses the first `lagging` calls as retriable, then answers; records each."""

    def __init__(self, lagging: int, error: MeridianError | None = None) -> None:
        self.lagging = lagging
        self.error = error or UnavailableError("another placement, as this agent sees it")
        self.digests: list[str] = []

    async def evict(
        self,
        dataset: str,
        keys: list[tuple[str, HLC]],
        sets: list[tuple[str, str]],
        *,
        placement_digest: str = "",
    ) -> agent_pb2.EvictResponse:
        self.digests.append(placement_digest)
        if len(self.digests) <= self.lagging:
            raise self.error
        return agent_pb2.EvictResponse(objects=1)


def plan() -> Eviction:
    out = Eviction("ckpt/a", "eu-north", list(PAGE), [], [], dry_run=False)
    out.placement_digest = "d1"
    return out


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evict, "EVICT_RETRY_S", 0.0)


async def test_a_lagging_agent_is_asked_again_with_the_proofs_placement() -> None:
    agent = Agent(lagging=2)
    answer = await evict._evict_page(agent, plan(), PAGE)  # type: ignore[arg-type]
    assert answer.objects == 1 and agent.digests == ["d1", "d1", "d1"]


async def test_a_refusal_that_lasts_is_raised_after_the_last_attempt() -> None:
    agent = Agent(lagging=EVICT_ATTEMPTS)
    with pytest.raises(UnavailableError):
        await evict._evict_page(agent, plan(), PAGE)  # type: ignore[arg-type]
    assert len(agent.digests) == EVICT_ATTEMPTS


@pytest.mark.parametrize(
    "error",
    [RefusedError("still places it in eu-north"), OperationTimeoutError("no answer in 60 s")],
)
async def test_a_refusal_or_a_timeout_is_raised_at_once(error: MeridianError) -> None:
    """A timed-out call may still run there: not asked again on top of it."""
    agent = Agent(lagging=1, error=error)
    with pytest.raises(type(error)):
        await evict._evict_page(agent, plan(), PAGE)  # type: ignore[arg-type]
    assert len(agent.digests) == 1
