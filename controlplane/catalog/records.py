"""Frozen records exchanged with the catalog (the contract other components code against)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

# The placement type is the domain's; re-exported so existing imports keep working.
from controlplane.domain.placement import DatasetClass, FailoverMode, Placement
from controlplane.domain.version import OPS, Op

__all__ = [
    "FAILOVER_KINDS",
    "FAILOVER_OUTCOMES",
    "REPLICA_STATES",
    "VERSION_OPS",
    "CatalogState",
    "CopyRecord",
    "DatasetClass",
    "FailoverKind",
    "FailoverMode",
    "FailoverOutcome",
    "FailoverRecord",
    "HeldVersion",
    "Holding",
    "HoldingState",
    "Placement",
    "Placer",
    "PolicyRevisionRecord",
    "RegionRecord",
    "ReplicaState",
    "ReplicaStatus",
    "RevisionDraft",
    "RevisionOutcome",
    "TransferRecord",
    "VersionOp",
    "VersionRef",
]

FailoverKind = Literal["automatic", "switchover", "failover", "drain"]
ReplicaState = Literal["pending", "completed", "failed"]
# A version's op is the domain's (a delete is a tombstone version).
VersionOp = Op
VERSION_OPS: tuple[str, ...] = OPS
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

    @property
    def details_json(self) -> dict[str, object]:
        """`details` as the object it was journaled as (the versions the new owner
        lacked, where the RPO was measured); text that is not one is kept as text."""
        try:
            value = json.loads(self.details) if self.details else {}
        except ValueError:
            return {"text": self.details}
        return value if isinstance(value, dict) else {"value": value}


@dataclass(frozen=True)
class VersionRef:
    """One version of one object; `hlc` orders versions (text form of dataplane.md)."""

    object: str
    version: str
    digest: str
    hlc: str = ""
    op: VersionOp = "put"


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
    # As in force when the copy was made (the agent journals them): the transfer is
    # judged by them. None (an older agent, a dataset placed after the apply): by the
    # catalog's current ones.
    from_jurisdiction: str | None = None
    to_jurisdiction: str | None = None
    residency: tuple[str, ...] | None = None
    residency_revision: int | None = None  # the policy revision the three came from


@dataclass(frozen=True)
class HeldVersion:
    """A version an agent stored, to register (`Catalog.record_holdings`); `version` is
    its HLC text, `digest` empty for a tombstone."""

    dataset: str
    key: str
    version: str
    op: VersionOp
    size: int
    digest: str
    origin_region: str
    created_at: datetime
    set_id: str | None = None


# What a region's agent says of its own copy of a version: it holds it (`completed`),
# lost its bytes (`failed`), or no longer holds it (`removed`).
HoldingState = Literal["completed", "failed", "removed"]


@dataclass(frozen=True)
class Holding:
    """One agent report on its region's copy of a registered version (see `HoldingState`);
    `digest` is the one it verified (completed puts), `error` says how bytes were lost."""

    dataset: str
    key: str
    version: str
    region: str
    state: HoldingState
    at: datetime
    digest: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class PolicyRevisionRecord:
    id: int
    digest: str
    source: str
    applied_by: str
    applied_at: datetime


@dataclass(frozen=True)
class ReplicaStatus:
    """Where one version of one object stands in one region (for the data plane)."""

    dataset: str
    object: str
    version: str
    hlc: str
    region: str
    state: ReplicaState
    verified_digest: str | None
    attempts: int
    last_error: str | None
    attempted_at: datetime | None
    updated_at: datetime


@dataclass(frozen=True)
class CopyRecord:
    """A replica and the transfer that made it, recorded together (`Catalog.record_copy`).

    `id` is the caller's idempotency key (it becomes the transfer's id): recording the
    same copy twice changes nothing. `state` is the replica's state after the copy:
    `completed` (then `verified_digest` is the digest the receiver checked), or
    `failed` (then `error` says why)."""

    id: str
    dataset: str
    object: str
    version: str
    from_region: str
    to_region: str
    state: ReplicaState
    logical_bytes: int
    wire_bytes: int
    at: datetime
    verified_digest: str | None = None
    error: str | None = None
    policy_revision: int | None = None


@dataclass(frozen=True)
class CatalogState:
    """What the catalog holds of the applied policy, as plain data (`policy plan` reads it)."""

    head: int  # id of the last revision, 0 if none
    head_digest: str | None
    document: Mapping[str, Any]
    regions: dict[str, str]
    datasets: dict[str, dict[str, str]]  # name -> labels
    placements: dict[str, Placement]


@dataclass(frozen=True)
class RevisionDraft:
    """What `policy apply` asks the catalog to commit, computed from a `CatalogState`."""

    digest: str
    document: dict[str, Any]
    regions: dict[str, str]  # name -> jurisdiction
    declared: dict[str, dict[str, str]]  # declared dataset -> labels
    placements: dict[str, Placement]  # every placed dataset
    changed: bool  # False: nothing would change, nothing is recorded


@dataclass(frozen=True)
class RevisionOutcome:
    revision: int  # 0 when no revision exists
    digest: str
    applied_at: datetime
    recorded: bool  # a new revision was committed
    # Names this catalog's line of revisions (from its first one), so that whoever
    # publishes revisions can order those of one catalog and tell another's apart.
    lineage: str = ""


# Places a dataset first seen on a write under the head revision's policy document:
# (document, dataset name, labels) -> its placement, or None when no policy selects it.
# The policy compiler provides it (`controlplane.policy.placer`); the catalog does not
# import the policy package, so the dependency runs one way.
Placer = Callable[[Mapping[str, Any], str, Mapping[str, str]], Placement | None]
