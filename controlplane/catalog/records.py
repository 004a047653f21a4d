"""Frozen records exchanged with the catalog (the contract other components code against)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

# The placement type is the domain's; re-exported so existing imports keep working.
from controlplane.domain.placement import DatasetClass, FailoverMode, Placement

__all__ = [
    "FAILOVER_KINDS",
    "FAILOVER_OUTCOMES",
    "REPLICA_STATES",
    "DatasetClass",
    "FailoverKind",
    "FailoverMode",
    "FailoverOutcome",
    "FailoverRecord",
    "Placement",
    "PolicyRevisionRecord",
    "RegionRecord",
    "ReplicaState",
    "TransferRecord",
    "VersionRef",
]

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
