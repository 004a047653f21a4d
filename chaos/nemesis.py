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
    """Faults one after another over `duration_s` of faults: each lasts a draw from
    `hold_s`, then a quiet gap from `gap_s`; kinds cycle, targets are drawn."""
    if not kinds or not targets:
        raise ValueError("a nemesis schedule needs at least one fault kind and one target")
    if duration_s <= 0 or hold_s[0] <= 0 or hold_s[0] > hold_s[1] or gap_s[0] > gap_s[1]:
        raise ValueError("durations must be positive and each range ordered (low, high)")
    rng = random.Random(seed)  # noqa: S311 - replayable from the seed, not a secret
    faults: list[Fault] = []
    t = warmup_s
    end = warmup_s + duration_s
    for i in range(10_000):  # bounded: at least hold_s[0] per fault
        if t >= end:
            break
        hold = min(rng.uniform(*hold_s), end - t)
        if hold < hold_s[0] / 2 and faults:
            break
        faults.append(Fault(kinds[i % len(kinds)], rng.choice(list(targets)), t, t + hold))
        t += hold + rng.uniform(*gap_s)
    return faults
