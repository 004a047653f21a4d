"""In-memory fakes of coordination's catalog Protocols (`catalog_glue.sources`), for unit tests."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from controlplane.coordination.catalog_glue.sources import JournalEntry, RegionInfo
from controlplane.domain.placement import Placement


class MemoryPlacements:
    def __init__(self, regions: list[RegionInfo], placements: list[Placement]) -> None:
        self._regions = list(regions)
        self._placements = list(placements)

    def regions(self) -> list[RegionInfo]:
        return list(self._regions)

    def placements(self) -> list[Placement]:
        return list(self._placements)


class MemoryJournal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: dict[str, JournalEntry] = {}

    def append(self, entry: JournalEntry) -> None:
        with self._lock:
            held = self.entries.get(entry.id)
            # As the catalog: a repeat is ignored, but the mover's own row replaces one
            # rebuilt late by another controller.
            if held is None or (
                held.details.get("backfilled") and not entry.details.get("backfilled")
            ):
                self.entries[entry.id] = entry

    def since(self, since: datetime | None) -> list[JournalEntry]:
        with self._lock:
            rows = [e for e in self.entries.values() if since is None or e.started_at >= since]
        return sorted(rows, key=lambda e: e.started_at)

    def missing(self, ids: Sequence[str]) -> set[str]:
        with self._lock:
            return {i for i in ids if i not in self.entries}


class MemoryCatchUp:
    def __init__(self) -> None:
        self.missing: dict[tuple[str, str], list[str]] = {}

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        return list(self.missing.get((dataset, region), []))
