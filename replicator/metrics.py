"""Prometheus metrics of one replicator, on a registry of its own (tests run several).

Names are the spec's (dataplane.md, *Metrics*). The lag and pending gauges are set
from durable state (the catalog, see backlog.py), never from counters kept in
memory, so a restarted replicator reports the true backlog at once.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReplicatorMetrics:
    def __init__(self, region: str) -> None:
        self.region = region
        self.registry = CollectorRegistry()
        self.lag_seconds = Gauge(
            "meridian_replication_lag_seconds",
            "now minus the HLC wall time of the oldest version not yet completed in the region",
            ["dataset", "region"],
            registry=self.registry,
        )
        self.rpo_seconds = Gauge(
            "meridian_dataset_rpo_seconds",
            "the dataset's rpo from its placement (what the lag is held against)",
            ["dataset", "region"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "meridian_replication_pending",
            "objects whose newest version is not yet completed in the region",
            ["dataset", "region"],
            registry=self.registry,
        )
        self.stale_epoch_refused = Counter(
            "meridian_stale_epoch_refused_total",
            "events of an older epoch than the dataset's current one, dead-lettered",
            ["dataset"],
            registry=self.registry,
        )
        self.failed = Counter(
            "meridian_replication_failed_total",
            "copies marked failed after max_attempts (re-driven by `meridian replication resync`)",
            ["dataset", "region"],
            registry=self.registry,
        )
        self.dlq = Counter(
            "meridian_dlq_total",
            "events sent to meridian.dlq, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.events = Counter(
            "meridian_replicator_events_total",
            "change events handled, by what became of them",
            ["result"],
            registry=self.registry,
        )
        self.retries = Counter(
            "meridian_replicator_retries_total",
            "attempts that failed and were retried",
            ["dataset"],
            registry=self.registry,
        )
        self.residency_refused = Counter(
            "meridian_residency_refused_total",
            "copies refused because this region is outside the dataset's residency",
            ["dataset", "direction"],
            registry=self.registry,
        )
        self.records_waiting = Gauge(
            "meridian_replicator_records_waiting",
            "records in the replicator's journal not yet shipped to the catalog",
            registry=self.registry,
        )
        self.committed_offsets = Counter(
            "meridian_replicator_offset_commits_total",
            "Kafka offset commits made",
            registry=self.registry,
        )
