"""A routed List or Rewind (a takeover proof's, agents/routing/service.py) gives each
peer what is left of the caller's deadline, at most 30 s, and 30 s when the caller set
none. A unit test: the servicer context is faked (only its `time_remaining`)."""

from __future__ import annotations

from typing import cast

import pytest

from agents.routing.service import FAN_OUT_TIMEOUT_S, fan_out_timeout
from agents.service.outcome import Context


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
