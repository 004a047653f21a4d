"""A nemesis schedule: when each fault starts and heals, drawn from a seed.

A scenario names its fault *kinds* and targets; `schedule` draws the timing (and
choices such as which target) from `random.Random(seed)` only, so one seed gives
one schedule and a run can be replayed from the seed it printed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # what the scenario's injector understands, e.g. "cut-etcd", "sigstop"
    target: str  # a region, an etcd member index, "catalog", ...
    start_s: float  # after the workload began
    end_s: float  # when it heals

    def describe(self) -> str:
        return f"{self.kind} {self.target} {self.start_s:.1f}s..{self.end_s:.1f}s"


def schedule(
    seed: int,
    kinds: Sequence[str],
    targets: Sequence[str],
    *,
    duration_s: float,
    hold_s: tuple[float, float],
    gap_s: tuple[float, float],
    warmup_s: float = 3.0,
) -> list[Fault]:
    """Faults one after another until they add up to `duration_s` of faults: each lasts
    a draw from `hold_s` (the last one cut to the total), then a quiet gap drawn from
    `gap_s`; kinds cycle, targets are drawn."""
    if not kinds or not targets:
        raise ValueError("a nemesis schedule needs at least one fault kind and one target")
    if duration_s <= 0 or hold_s[0] <= 0 or hold_s[0] > hold_s[1] or gap_s[0] > gap_s[1]:
        raise ValueError("durations must be positive and each range ordered (low, high)")
    rng = random.Random(seed)  # noqa: S311 - replayable from the seed, not a secret
    faults: list[Fault] = []
    t, faulted = warmup_s, 0.0
    for i in range(10_000):  # bounded: each fault adds at least min(hold_s[0], what is left)
        left = duration_s - faulted
        if left <= 0:
            break
        hold = rng.uniform(*hold_s)
        if left - hold < hold_s[0] / 2:
            hold = left  # no stub of a fault at the end: the last one takes what is left
        faults.append(Fault(kinds[i % len(kinds)], rng.choice(list(targets)), t, t + hold))
        faulted += hold
        t += hold + rng.uniform(*gap_s)
    return faults
