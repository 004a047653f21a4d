"""Frozen records exchanged with the catalog (the contract other components code against)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

DatasetClass = Literal["critical", "standard"]
FailoverMode = Literal["automatic", "manual"]
FailoverKind = Literal["automatic", "switchover", "failover", "drain"]
ReplicaState = Literal["pending", "completed", "failed"]
REPLICA_STATES: tuple[str, ...] = ("pending", "completed", "failed")
FAILOVER_KINDS: tuple[str, ...] = ("automatic", "switchover", "failover", "drain")
# "moved": ownership moved to `to_region`; "aborted": a switchover that gave up and
# left ownership where it was (`to_region` is then the region that kept it).
FailoverOutcome = Literal["moved", "aborted"]
FAILOVER_OUTCOMES: tuple[str, ...] = ("moved", "aborted")


@dataclass(frozen=True)
class RegionRecord:
    name: str
    jurisdiction: str


@dataclass(frozen=True)
class Placement:
    """The desired placement of one dataset, as compiled by the last `policy apply`."""

    dataset: str
    policy: str
    dataset_class: DatasetClass
    home: str
    replicas: tuple[str, ...]
    residency: tuple[str, ...]
    failover_mode: FailoverMode
    failover_order: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "class": self.dataset_class,
            "home": self.home,
            "replicas": list(self.replicas),
            "residency": list(self.residency),
            "failover_mode": self.failover_mode,
            "failover_order": list(self.failover_order),
        }


@dataclass(frozen=True)
class FailoverRecord:
    """One entry of the failover journal; `id` is chosen by the caller (idempotency key)."""

    id: str
    dataset: str
    from_region: str | None
    to_region: str
    epoch: int
    kind: FailoverKind
    reason: str
    actor: str
    detected_at: datetime | None
    started_at: datetime
    completed_at: datetime | None
    rpo_versions: int = 0
    details: str = ""
    outcome: FailoverOutcome = "moved"


@dataclass(frozen=True)
class VersionRef:
    object: str
    version: str
    digest: str


@dataclass(frozen=True)
class TransferRecord:
    """One cross-region copy; `id` is chosen by the caller (recording it twice is a no-op)."""

    id: str
    dataset: str
    object: str
    version: str | None
    from_region: str
    to_region: str
    logical_bytes: int
    wire_bytes: int
    outcome: str
    at: datetime
    policy_revision: int | None = None


@dataclass(frozen=True)
class PolicyRevisionRecord:
    id: int
    digest: str
    source: str
    applied_by: str
    applied_at: datetime
