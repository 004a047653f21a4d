"""The rebalance's Prometheus series, on the agent's registry (its `--metrics`):

- `meridian_rebalance_passes_total{outcome}`: passes ended `settled` (everything is
  where it belongs), `unfinished` (something could not move; retried soon) or
  `failed` (the pass raised);
- `meridian_rebalance_pass_seconds`: how long the passes that had work took;
- `meridian_rebalance_moved_objects_total`, `meridian_rebalance_moved_bytes_total`:
  copies a new owner took from this agent; `meridian_rebalance_handed_off_total`:
  copies this agent forgot once their owners held them;
  `meridian_rebalance_copy_failures_total`: copies that did not reach an owner;
- `meridian_rebalance_remaining_objects`, `meridian_rebalance_remaining_bytes`: what
  the pass in progress still has to move (0 when none runs), read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class RebalanceMetrics:
    def __init__(
        self, registry: CollectorRegistry, remaining: Callable[[], tuple[int, int]]
    ) -> None:
        self.passes = Counter(
            "meridian_rebalance_passes_total",
            "rebalance passes ended, by outcome (settled, unfinished, failed)",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("settled", "unfinished", "failed"):
            self.passes.labels(outcome=outcome)
        self.pass_seconds = Histogram(
            "meridian_rebalance_pass_seconds",
            "duration of the rebalance passes that had objects to move",
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        self.moved_objects = Counter(
            "meridian_rebalance_moved_objects_total",
            "copies a new owner in the region took from this agent",
            registry=registry,
        )
        self.moved_bytes = Counter(
            "meridian_rebalance_moved_bytes_total",
            "bytes of the copies a new owner took from this agent",
            registry=registry,
        )
        self.handed_off = Counter(
            "meridian_rebalance_handed_off_total",
            "copies this agent forgot once the object's owners held them",
            registry=registry,
        )
        self.copy_failures = Counter(
            "meridian_rebalance_copy_failures_total",
            "copies of a rebalance that did not reach their new owner (retried)",
            registry=registry,
        )
        self.remaining_objects = Gauge(
            "meridian_rebalance_remaining_objects",
            "objects the rebalance in progress still has to move",
            registry=registry,
        )
        self.remaining_objects.set_function(lambda: float(remaining()[0]))
        self.remaining_bytes = Gauge(
            "meridian_rebalance_remaining_bytes",
            "bytes the rebalance in progress still has to move",
            registry=registry,
        )
        self.remaining_bytes.set_function(lambda: float(remaining()[1]))
