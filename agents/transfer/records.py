"""The transfer record: what one copy moved, between which regions and jurisdictions,
and how it ended. It goes into the store's journal (with the version it committed,
or on its own when nothing was committed) so that the recorder ships it to the
catalog; the same figures feed the transfer metrics."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from agents.metrics import AgentMetrics
from agents.store.model import JsonValue
from agents.transfer.ports import PolicySource

Outcome = Literal["completed", "refused", "failed", "skipped"]
Direction = Literal["in", "out"]


def new_transfer_id() -> str:
    return uuid.uuid4().hex


@dataclass
class TransferTally:
    """The running figures of one transfer, filled in as it goes."""

    transfer_id: str
    dataset: str
    key: str
    from_region: str
    to_region: str
    direction: Direction
    method: str = ""
    logical_bytes: int = 0
    wire_bytes: int = 0
    resent_bytes: int = 0  # bytes an earlier, cut attempt received past its checkpoint
    resumed_from: int = 0
    policy_revision: int | None = None
    started: float = field(default_factory=time.monotonic)

    def record(
        self, outcome: Outcome, policy: PolicySource, reason: str = ""
    ) -> dict[str, JsonValue]:
        """The journal form (the catalog's TransferRecord fields plus jurisdictions)."""
        current = policy()
        regions = current.regions if current is not None else {}
        # The residency in force now, journaled with the copy (the catalog judges the
        # transfer by it: audit residency reports past transfers by their time's rules).
        # Only a placement known at apply time: placing a later dataset costs a planner
        # run, and the catalog's current residency stands in for it.
        placed = current.placements.get(self.dataset) if current is not None else None
        return {
            "id": self.transfer_id,
            "dataset": self.dataset,
            "object": self.key,
            "from_region": self.from_region,
            "to_region": self.to_region,
            "from_jurisdiction": regions.get(self.from_region),
            "to_jurisdiction": regions.get(self.to_region),
            "direction": self.direction,
            "method": self.method,
            "logical_bytes": self.logical_bytes,
            "wire_bytes": self.wire_bytes,
            "resent_bytes": self.resent_bytes,
            "resumed_from": self.resumed_from,
            "outcome": outcome,
            "reason": reason,
            "policy_revision": self.policy_revision,
            "residency": None if placed is None else list(placed.residency),
            "residency_revision": None if placed is None or current is None else current.revision,
            "seconds": round(time.monotonic() - self.started, 6),
        }

    def count(self, metrics: AgentMetrics, outcome: Outcome) -> None:
        """Add this transfer to the agent's metrics (once, when it ends)."""
        metrics.transfer_bytes.labels(kind="logical", direction=self.direction).inc(
            self.logical_bytes
        )
        metrics.transfer_bytes.labels(kind="wire", direction=self.direction).inc(self.wire_bytes)
        metrics.transfer_resent_bytes.inc(self.resent_bytes)
        metrics.transfers.labels(direction=self.direction, outcome=outcome).inc()
        metrics.transfer_seconds.labels(direction=self.direction, outcome=outcome).observe(
            time.monotonic() - self.started
        )


def count_many(metrics: AgentMetrics, ended: list[tuple[TransferTally, Outcome]]) -> None:
    """`TransferTally.count` for many transfers that ended together (a batch call): the
    same totals, with each metric's labels looked up once per batch, not per transfer."""
    now = time.monotonic()
    by_direction: dict[Direction, list[int]] = {}
    by_outcome: dict[tuple[Direction, Outcome], list[float]] = {}
    for tally, outcome in ended:
        sums = by_direction.setdefault(tally.direction, [0, 0, 0])
        sums[0] += tally.logical_bytes
        sums[1] += tally.wire_bytes
        sums[2] += tally.resent_bytes
        by_outcome.setdefault((tally.direction, outcome), []).append(now - tally.started)
    for direction, (logical, wire, resent) in by_direction.items():
        metrics.transfer_bytes.labels(kind="logical", direction=direction).inc(logical)
        metrics.transfer_bytes.labels(kind="wire", direction=direction).inc(wire)
        metrics.transfer_resent_bytes.inc(resent)
    for (direction, outcome), seconds in by_outcome.items():
        metrics.transfers.labels(direction=direction, outcome=outcome).inc(len(seconds))
        histogram = metrics.transfer_seconds.labels(direction=direction, outcome=outcome)
        for s in seconds:
            histogram.observe(s)
