"""Prometheus metrics of one region controller, on a registry of its own (tests run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self, region: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"region": region}
        self.active = Gauge(
            "meridian_controller_active",
            "1 while this controller is its region's elected active controller",
            registry=self.registry,
        )
        self.owned = Gauge(
            "meridian_controller_datasets_owned",
            "critical datasets this controller's region owns",
            registry=self.registry,
        )
        self.claims = Counter(
            "meridian_controller_claims_total",
            "ownership claims of unowned datasets won",
            registry=self.registry,
        )
        self.failovers = Counter(
            "meridian_controller_failovers_total",
            "automatic failover transactions won by this controller",
            registry=self.registry,
        )
        self.fenced = Counter(
            "meridian_controller_fenced_writes_total",
            "writes refused because this controller presented a stale epoch",
            registry=self.registry,
        )
        self.step_downs = Counter(
            "meridian_controller_step_downs_total",
            "times this controller lost its lease and stepped down",
            registry=self.registry,
        )
        self.failover_seconds = Histogram(
            "meridian_controller_failover_seconds",
            "from noticing a dead region to the last of its datasets moved",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.journal_deferred = Gauge(
            "meridian_controller_journal_deferred",
            "journal rows of committed moves waiting for the catalog to come back",
            registry=self.registry,
        )
        self.info = Gauge(
            "meridian_controller_info", "static labels", list(labels), registry=self.registry
        )
        self.info.labels(**labels).set(1)
