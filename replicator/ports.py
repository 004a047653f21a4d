"""The replicator's ports: its region's agent, and the catalog it records into.

The replicator never touches bytes or the store itself; it asks its region's agent
to apply a version (STYLE.md item 1: one port per external system, its guarantees
written on it). `agent_grpc` adapts `AgentPort` to the agent's gRPC API;
tests/fakes/replicator.py holds an in-memory agent for unit tests.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from controlplane.catalog.records import TransferRecord
from controlplane.domain.events import ChangeEvent, SetEvent
from controlplane.domain.version import Version


class ApplyOutcome(enum.Enum):
    """What the agent did with an incoming version (its own LWW, `controlplane.domain.lww`)."""

    APPLIED = "applied"  # newer than anything held: stored (or the tombstone written)
    SAME = "same"  # that very version is already held: a replay, a no-op
    OLDER = "older"  # a newer version (put or tombstone) is held: a no-op
    COLLISION = "collision"  # equal HLC, other content: what was held is kept

    @property
    def holds_version(self) -> bool:
        """The region now holds the incoming version itself (its replica is complete)."""
        return self in (ApplyOutcome.APPLIED, ApplyOutcome.SAME)


@dataclass(frozen=True)
class ApplyResult:
    outcome: ApplyOutcome
    held: Version | None  # the newest version the agent holds after the call
    source_region: str | None = None  # which region served the bytes (fetches)
    logical_bytes: int = 0
    wire_bytes: int = 0


@dataclass(frozen=True)
class Source:
    """An agent that holds a version: where a fetch may pull it from."""

    region: str
    address: str


class AgentPort(Protocol):
    """The region's agent, as the replicator uses it.

    Guarantees an adapter must give:
    - Every call applies by LWW in the agent (strictly greater HLC applies; equal or
      older is a no-op), so calling twice with one event has one effect: redelivery,
      rebalance and replay after a crash are safe.
    - A call returns only after the agent's commit is durable (the version, its
      journal row and its transfer record in one transaction); the caller may then
      commit its Kafka offset.
    - Errors are Meridian errors: `retriable` ones (agent or peer unreachable, a
      handover) may be retried as they are; `agents.errors.ResidencyError` means the
      agent refused to store a copy here (never retried); others are final.
    """

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        """Store the event's inline bytes as its version (a put carrying `inline`)."""
        ...

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        """Write the event's tombstone."""
        ...

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        """Pull the event's version from `sources` (tried in order) and apply it."""
        ...

    async def apply_many(self, events: Sequence[ChangeEvent]) -> list[ApplyResult | Exception]:
        """Inline puts and deletes of distinct objects, committed together (one call, one
        transaction in the agent). One answer per event, in order: its result, or the
        error refusing that event alone (a failure of the whole call raises)."""
        ...

    async def head(self, dataset: str, key: str) -> Version | None:
        """The newest version the agent holds of an object (a tombstone too), or None."""
        ...


@dataclass(frozen=True)
class SetApplyResult:
    """What the agent did with an incoming version set: its LWW verdict (per set id, by
    the set's HLC), and, when it now records that set, whether every member is stored
    (only then is it visible) and which are still missing."""

    outcome: ApplyOutcome
    complete: bool
    missing: tuple[str, ...] = ()


class SetPort(Protocol):
    """Version sets of standard datasets, applied in the region's agent.

    Same guarantees as AgentPort: LWW in the agent (a newer set HLC replaces the set of
    that id, an equal or older one is a no-op), durable before it answers, errors as
    Meridian errors (a residency refusal as `ResidencyError`)."""

    async def apply_set(self, event: SetEvent) -> SetApplyResult:
        """Record the event's set: visible in the region once every member is stored."""
        ...


class ReplicaRecords(Protocol):
    """The part of the catalog (`controlplane.catalog.api.Catalog`) the replicator writes.

    Synchronous and idempotent on natural keys and ids (see the catalog's
    docstring); the replicator calls it from a thread, never on the data path."""

    def register_version(
        self,
        dataset: str,
        key: str,
        version: str,
        digest: str,
        *,
        size: int = 0,
        origin_region: str | None = None,
        created_at: datetime | None = None,
        hlc: str | None = None,
        op: str = "put",
        set_id: str | None = None,
    ) -> None: ...

    def set_replica_state(
        self,
        dataset: str,
        key: str,
        version: str,
        region: str,
        state: str,
        *,
        digest: str | None = None,
        error: str | None = None,
        attempted_at: datetime | None = None,
    ) -> None: ...

    def record_transfer(self, rec: TransferRecord) -> None: ...
