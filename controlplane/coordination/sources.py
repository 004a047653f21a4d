"""What coordination needs from the catalog, as narrow Protocols, plus in-memory fakes.

The catalog (`controlplane.catalog`, issue 4) satisfies these through
`catalog_bridge.CatalogBridge`; unit tests use the `Memory*` fakes. All methods are
synchronous (the catalog is a thread-safe SQLAlchemy facade); async callers use
`asyncio.to_thread`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RegionInfo:
    name: str
    jurisdiction: str


@dataclass(frozen=True, slots=True)
class PlacementInfo:
    """The applied placement of one dataset, as failover decisions need it."""

    dataset: str
    policy: str
    dataset_class: str  # "critical" | "standard"
    home: str
    replicas: tuple[str, ...]
    residency: tuple[str, ...]
    failover_mode: str  # "automatic" | "manual"
    failover_order: tuple[str, ...]


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


class PlacementSource(Protocol):
    """The topology and the applied placements."""

    def regions(self) -> list[RegionInfo]: ...

    def placements(self) -> list[PlacementInfo]: ...


class FailoverJournal(Protocol):
    """Append-only journal of ownership moves; `append` is idempotent on `entry.id`."""

    def append(self, entry: JournalEntry) -> None: ...

    def since(self, since: datetime | None) -> list[JournalEntry]: ...


class CatchUpProbe(Protocol):
    """Which versions of a dataset a region has not completed yet (empty: caught up)."""

    def incomplete_versions(self, dataset: str, region: str) -> list[str]: ...


class MemoryPlacements:
    def __init__(self, regions: list[RegionInfo], placements: list[PlacementInfo]) -> None:
        self._regions = list(regions)
        self._placements = list(placements)

    def regions(self) -> list[RegionInfo]:
        return list(self._regions)

    def placements(self) -> list[PlacementInfo]:
        return list(self._placements)


class MemoryJournal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: dict[str, JournalEntry] = {}

    def append(self, entry: JournalEntry) -> None:
        with self._lock:
            self.entries.setdefault(entry.id, entry)

    def since(self, since: datetime | None) -> list[JournalEntry]:
        with self._lock:
            rows = [e for e in self.entries.values() if since is None or e.started_at >= since]
        return sorted(rows, key=lambda e: e.started_at)


class MemoryCatchUp:
    def __init__(self) -> None:
        self.missing: dict[tuple[str, str], list[str]] = {}

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        return list(self.missing.get((dataset, region), []))
