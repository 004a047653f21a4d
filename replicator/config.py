"""The replicator's knobs, with units in their names (STYLE.md item 7)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.domain.hlc import DEFAULT_MAX_CLOCK_SKEW_MS


def group_id(region: str) -> str:
    """The consumer group of a destination region: one per region (dataplane.md)."""
    return f"meridian-replicator-{region}"


@dataclass(frozen=True)
class ReplicatorConfig:
    region: str
    # Events applied at once (across objects; one object's events stay in order).
    max_in_flight: int = 64
    # Attempts of one copy before its replica is `failed` (then `replication resync`).
    max_attempts: int = 5
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    max_clock_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS
    poll_max_records: int = 500
    poll_timeout_ms: int = 200
    commit_interval_s: float = 0.2
    # A batch: the inline events of a run of one poll's records, of any partitions (it
    # never waits to fill one), applied in one agent call; bounded by events and bytes
    # (the call is one gRPC message of at most ~1 MiB). 1 turns batching off.
    batch_max_events: int = 256
    batch_max_bytes: int = 768 * 1024
    # Batch calls at the agent at once: its store commits one transaction at a time, so
    # more only queue there, and past the call's deadline they fail and come again.
    max_batch_calls: int = 2
    backlog_interval_s: float = 1.0
    # How long a stop (or a rebalance) waits for events in flight before it cancels them.
    drain_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_in_flight",
            "max_attempts",
            "poll_max_records",
            "batch_max_events",
            "max_batch_calls",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
