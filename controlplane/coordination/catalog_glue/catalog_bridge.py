"""The real catalog (`controlplane.catalog`, issue 4) behind coordination's narrow Protocols.

Imports the catalog lazily so that coordination's unit tests do not need a
database. `kind` values follow the catalog's journal (`automatic`, `switchover`,
`failover`, `drain`); `outcome` is "moved", or "aborted" for a switchover that left
ownership where it was (see `orchestration.journal.aborted_entry`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.coordination.catalog_glue.sources import JournalEntry, RegionInfo
from controlplane.domain.placement import Placement


class CatalogBridge:
    """Adapts a `controlplane.catalog.Catalog` to PlacementSource, FailoverJournal, CatchUpProbe."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog

    @classmethod
    def open(cls, url: str) -> CatalogBridge:
        from controlplane.catalog.api import open_catalog
        from controlplane.policy.placer import place

        return cls(open_catalog(url, placer=place))

    def close(self) -> None:
        self.catalog.close()

    def regions(self) -> list[RegionInfo]:
        return [RegionInfo(r.name, r.jurisdiction) for r in self.catalog.list_regions()]

    def placements(self) -> list[Placement]:
        return list(self.catalog.list_placements())

    def append(self, entry: JournalEntry) -> None:
        from controlplane.catalog.records import FailoverRecord

        self.catalog.append_failover(
            FailoverRecord(
                id=entry.id,
                dataset=entry.dataset,
                from_region=entry.from_region,
                to_region=entry.to_region,
                epoch=entry.epoch,
                kind=entry.kind,  # type: ignore[arg-type]
                reason=entry.reason,
                actor=entry.actor,
                detected_at=entry.detected_at,
                started_at=entry.started_at,
                completed_at=entry.completed_at,
                rpo_versions=entry.rpo_versions,
                details=json.dumps(entry.details, sort_keys=True, default=str),
                outcome="aborted" if entry.outcome == "aborted" else "moved",
            )
        )

    def since(self, since: datetime | None) -> list[JournalEntry]:
        out = []
        for r in self.catalog.list_failovers(since):
            out.append(
                JournalEntry(
                    id=r.id,
                    dataset=r.dataset,
                    from_region=r.from_region,
                    to_region=r.to_region,
                    epoch=r.epoch,
                    kind=r.kind,
                    reason=r.reason,
                    actor=r.actor,
                    detected_at=r.detected_at,
                    started_at=r.started_at,
                    completed_at=r.completed_at,
                    rpo_versions=r.rpo_versions,
                    details=r.details_json,
                    outcome=r.outcome,
                )
            )
        return out

    def datasets(self, pattern: str = "*") -> list[tuple[str, Placement | None]]:
        """Every dataset in the catalog whose name matches the glob `pattern`, with its
        placement, or None when no applied policy places it (registered on first write,
        or its policy was removed): `dataset list` shows those too."""
        return list(self.catalog.datasets(pattern))

    def lag_seconds(self, placement: Placement, now: datetime) -> float:
        """Replication lag of a placed dataset, from the catalog: the age of the oldest
        latest version of an object that some region of the placement (home and
        replicas, other than the version's origin unless its copy there is `failed`) has
        not completed; 0.0 when every region has completed every object's latest version
        (or there is none)."""
        oldest: datetime | None = self.catalog.oldest_incomplete_at(
            placement.dataset, (placement.home, *placement.replicas)
        )
        if oldest is None:
            return 0.0
        return round(max(0.0, (now - oldest).total_seconds()), 3)

    def missing(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have no row in the failover journal (primary-key lookups)."""
        return set(self.catalog.missing_failovers(ids))

    def locations(self, dataset: str) -> list[dict[str, Any]]:
        """Where each version of each object of `dataset` lives (the audit query)."""
        return list(self.catalog.dataset_locations(dataset))

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        return [
            f"{v.object}@{v.version}" for v in self.catalog.incomplete_versions(dataset, region)
        ]
