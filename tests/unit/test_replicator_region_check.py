"""`replicator run` checks at start that its agent serves its region
(replicator/run.py, `_check_region`): another region's agent is refused with one
sentence, one that answers after a while is checked then, and one that never answers
is applied through unchecked (said in the log) after a bounded number of tries."""

from __future__ import annotations

import pytest

from controlplane.errors import ConfigError, UnavailableError
from replicator.run import _check_region


class Agent:
    def __init__(self, region: str, silent: int) -> None:
        self.address = "10.0.0.9:7400"
        self.serves = region
        self.silent = silent  # tries unanswered before it answers
        self.asked = 0

    async def region(self, *, timeout_s: float | None = None) -> str:
        self.asked += 1
        if self.asked <= self.silent:
            raise UnavailableError("the agent did not answer (test)")
        return self.serves


async def test_another_region_s_agent_is_refused_once_it_answers() -> None:
    agent = Agent("eu-west", silent=2)
    with pytest.raises(ConfigError, match="serves region eu-west, not eu-central"):
        await _check_region(agent, "eu-central", pause_s=0)  # type: ignore[arg-type]
    assert agent.asked == 3


async def test_its_own_region_passes_and_silence_is_bounded() -> None:
    own = Agent("eu-central", silent=1)
    await _check_region(own, "eu-central", pause_s=0)  # type: ignore[arg-type]
    assert own.asked == 2
    silent = Agent("eu-west", silent=1_000)
    await _check_region(silent, "eu-central", attempts=4, pause_s=0)  # type: ignore[arg-type]
    assert silent.asked == 4  # gave up, unchecked
