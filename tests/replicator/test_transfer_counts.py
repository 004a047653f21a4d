"""`count_many`, the ReplicateMany handler's metrics for a whole batch: the same totals
as counting each transfer on its own."""

from __future__ import annotations

import time

from agents.metrics import AgentMetrics
from agents.transfer.records import Outcome, TransferTally, count_many


def _samples(metrics: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in metrics.registry.collect():
        if not family.name.startswith("meridian_transfer"):
            continue
        for s in family.samples:
            if s.name.endswith("_created") or s.name.endswith("_sum"):
                continue  # creation times, and the seconds (they differ by the clock)
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counting_a_batch_gives_the_totals_of_counting_each() -> None:
    ended: list[tuple[TransferTally, Outcome]] = []
    for n in range(7):
        tally = TransferTally(
            f"t{n}", "ds", f"k{n}", "us-east", "eu-west", "in" if n % 3 else "out", "push"
        )
        tally.logical_bytes, tally.wire_bytes, tally.resent_bytes = 100 * n, 90 * n, n
        tally.started = time.monotonic() - 1.7  # both ways land in one seconds bucket
        ended.append((tally, "completed" if n % 2 else "skipped"))
    one_by_one, batched = AgentMetrics("eu-west", "a"), AgentMetrics("eu-west", "b")
    for tally, outcome in ended:
        tally.count(one_by_one, outcome)
    count_many(batched, ended)
    expected = _samples(one_by_one)
    assert expected[("meridian_transfers_total", (("direction", "in"), ("outcome", "completed")))]
    assert _samples(batched) == expected
