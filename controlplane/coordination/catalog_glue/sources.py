"""What coordination needs from the catalog, as narrow Protocols.

The catalog (`controlplane.catalog`, issue 4) satisfies these through
`catalog_bridge.CatalogBridge`; unit tests use the in-memory fakes of
`tests/fakes/catalog.py`. All methods are
synchronous (the catalog is a thread-safe SQLAlchemy facade); async callers use
`asyncio.to_thread`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.domain.placement import Placement


@dataclass(frozen=True, slots=True)
class RegionInfo:
    name: str
    jurisdiction: str


JOURNAL_ID_MAX = 64  # the catalog's `failovers.id` is VARCHAR(64)


def journal_id(dataset: str, epoch: int, suffix: str = "") -> str:
    """The journal row id of the move of `dataset` to `epoch`: `dataset@epoch` + suffix.

    Deterministic, so a row lost by a crash can be rebuilt under the same id (and
    appending it twice is a no-op). A name too long for the catalog's column is cut
    and given a digest of the whole name, so ids stay unique and readable.
    """
    tail = f"@{epoch}{suffix}"
    whole = f"{dataset}{tail}"
    if len(whole) <= JOURNAL_ID_MAX:
        return whole
    digest = hashlib.sha256(dataset.encode()).hexdigest()[:12]
    keep = JOURNAL_ID_MAX - len(tail) - len(digest) - 1
    return f"{dataset[: max(keep, 0)]}~{digest}{tail}"[-JOURNAL_ID_MAX:]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One ownership move, as journaled (the catalog's FailoverRecord)."""

    id: str
    dataset: str
    from_region: str | None
    to_region: str
    epoch: int
    kind: str  # "automatic" | "switchover" | "failover" | "drain"
    reason: str
    actor: str
    detected_at: datetime | None
    started_at: datetime
    completed_at: datetime | None
    rpo_versions: int = 0
    details: dict[str, object] = field(default_factory=dict)
    outcome: str = "moved"  # "moved" | "aborted" (see orchestration.journal.aborted_entry)


class PlacementSource(Protocol):
    """The topology and the applied placements."""

    def regions(self) -> list[RegionInfo]: ...

    def placements(self) -> list[Placement]: ...


class FailoverJournal(Protocol):
    """Append-only journal of ownership moves; `append` is idempotent on `entry.id`."""

    def append(self, entry: JournalEntry) -> None: ...

    def since(self, since: datetime | None) -> list[JournalEntry]: ...

    def missing(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have no journal row (one indexed lookup per batch)."""
        ...


class CatchUpProbe(Protocol):
    """Which versions of a dataset a region has not completed yet (empty: caught up).

    Entries are `key@hlc`; an entry in parentheses says instead why the versions could
    not be compared (`unmeasured`): a wait treats it as not caught up, a journal row as
    an RPO it could not measure, never as one missing version."""

    def incomplete_versions(self, dataset: str, region: str) -> list[str]: ...


def unmeasured(entry: str) -> bool:
    """Whether an `incomplete_versions` entry is a reason, not a version (a version's
    entry ends with its HLC's region name, which never ends with a parenthesis)."""
    return entry.startswith("(") and entry.endswith(")")
