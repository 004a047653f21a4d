"""Prometheus metrics of one node agent, on a registry of its own (tests run several agents
in one process). The names and labels are the spec's (dataplane.md, *Metrics*); every part
of the agent (API, admission, transfers, recorder, outbox drain) counts into the one
`AgentMetrics` its daemon made, and `--metrics` serves its registry."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Transfer sizes span 4 KiB objects to multi-GiB checkpoints over WAN links.
TRANSFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# API calls and critical pushes: a small write answers in a millisecond, an acked one
# takes a WAN round trip or more, a whole checkpoint shard seconds to minutes.
CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5,
    10, 30, 60, 300,
)  # fmt: skip
PUSH_ITEMS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class AgentMetrics:
    def __init__(self, region: str, agent_id: str = "") -> None:
        self.registry = CollectorRegistry()
        self.objects = Gauge(
            "meridian_agent_objects", "objects this agent holds", registry=self.registry
        )
        self.bytes_stored = Gauge(
            "meridian_agent_bytes_stored",
            "bytes of the version files this agent holds",
            registry=self.registry,
        )
        self.requests = Counter(
            "meridian_agent_requests_total",
            "agent API calls answered, by call and gRPC status code",
            ["call", "code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "meridian_agent_request_seconds",
            "wall time of an API call in the agent, from its handler's start to its status "
            "(a server stream's includes its client's reading)",
            ["call"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self._call_timers: dict[str, Histogram] = {}
        self.push_seconds = Histogram(
            "meridian_critical_push_seconds",
            "an owner's synchronous pushes of small critical versions to a replica region: "
            "the time one waited for a call to that region (stage=queued), and each call "
            "to it, a ReplicatePushes or a Replicate, from its start to its answer (stage=call); "
            "to_region names the replica region (the scrape adds the agent's own as region)",
            ["to_region", "stage"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.push_items = Histogram(
            "meridian_critical_push_items",
            "versions carried by one push call to a replica region (counted as it starts)",
            ["to_region"],
            buckets=PUSH_ITEMS_BUCKETS,
            registry=self.registry,
        )
        self.transfer_bytes = Counter(
            "meridian_transfer_bytes_total",
            "bytes moved by transfers: logical (content) and wire (what crossed the link)",
            ["kind", "direction"],
            registry=self.registry,
        )
        self.transfer_seconds = Histogram(
            "meridian_transfer_seconds",
            "duration of one transfer, from start to commit (or failure)",
            ["direction", "outcome"],
            buckets=TRANSFER_BUCKETS,
            registry=self.registry,
        )
        self.transfer_resent_bytes = Counter(
            "meridian_transfer_resent_bytes_total",
            "bytes a resumed transfer received twice (past the cut attempt's last checkpoint)",
            registry=self.registry,
        )
        self.transfers = Counter(
            "meridian_transfers_total",
            "transfers ended, by direction and outcome",
            ["direction", "outcome"],
            registry=self.registry,
        )
        self.residency_refused = Counter(
            "meridian_residency_refused_total",
            "copies refused because the receiving region is outside the dataset's residency",
            ["dataset", "direction"],
            registry=self.registry,
        )
        self.stale_epoch_refused = Counter(
            "meridian_stale_epoch_refused_total",
            "critical writes refused for an epoch older than the newest seen",
            ["dataset"],
            registry=self.registry,
        )
        self.handover_refused = Counter(
            "meridian_handover_refused_total",
            "critical writes refused (retriable) while their dataset was handing over",
            ["dataset"],
            registry=self.registry,
        )
        self.records_behind = Gauge(
            "meridian_records_behind_seconds",
            "age of the oldest journal record not yet shipped to the catalog (0 when caught up)",
            registry=self.registry,
        )
        self.records_shipped = Counter(
            "meridian_records_shipped_total",
            "journal records shipped to the catalog",
            registry=self.registry,
        )
        self.records_set_aside = Counter(
            "meridian_records_set_aside_total",
            "journal records the catalog refused for good, and outbox events that could not "
            "be encoded, kept aside (in the store root) instead of blocking their queue",
            ["queue"],
            registry=self.registry,
        )
        self.evicted_objects = Counter(
            "meridian_evicted_objects_total",
            "objects forgotten by `meridian dataset evict` (their region no longer places "
            "their dataset)",
            ["dataset"],
            registry=self.registry,
        )
        self.tombstones_expired = Counter(
            "meridian_tombstones_expired_total",
            "objects forgotten with their tombstone once it outlived the retention",
            registry=self.registry,
        )
        self.outbox_pending = Gauge(
            "meridian_outbox_pending",
            "change events committed in the outbox and not yet published to Kafka",
            registry=self.registry,
        )
        self.outbox_behind = Gauge(
            "meridian_outbox_behind_seconds",
            "age of the oldest change event not yet published to Kafka (0 when none waits)",
            registry=self.registry,
        )
        self.outbox_published = Counter(
            "meridian_outbox_published_total",
            "change events published to Kafka",
            registry=self.registry,
        )
        self.outbox_superseded = Counter(
            "meridian_outbox_superseded_total",
            "change events dropped unsent: their put was pruned here before it went out "
            "(a newer version of its key is held, and its event goes on the same key)",
            registry=self.registry,
        )
        self.info = Gauge(
            "meridian_agent_info", "static labels", ["region", "agent_id"], registry=self.registry
        )
        self.info.labels(region=region, agent_id=agent_id).set(1)

    def call_timer(self, call: str) -> Histogram:
        """`request_seconds` of one call, its child looked up once (every call uses it)."""
        timer = self._call_timers.get(call)
        if timer is None:
            timer = self._call_timers[call] = self.request_seconds.labels(call=call)
        return timer

    def expect_peers(self, regions: Iterable[str]) -> None:
        """Start the push series to each of `regions` at zero, before any push: a rate
        sees only what a counter gained after its first scrape, so pushes made before a
        lazily created series was first scraped would never show on a panel."""
        for region in regions:
            for stage in ("queued", "call"):
                self.push_seconds.labels(to_region=region, stage=stage)
            self.push_items.labels(to_region=region)
