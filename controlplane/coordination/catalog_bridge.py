"""The real catalog (`controlplane.catalog`, issue 4) behind coordination's narrow Protocols.

Imports the catalog lazily so that coordination's unit tests do not need a
database. `kind` values follow the catalog's journal (`automatic`, `switchover`,
`failover`, `drain`); an aborted switchover is journaled as `switchover` with
`details.aborted = true`, its epoch the unchanged one.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from controlplane.coordination.sources import JournalEntry, PlacementInfo, RegionInfo


class CatalogBridge:
    """Adapts a `controlplane.catalog.Catalog` to PlacementSource, FailoverJournal, CatchUpProbe."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog

    @classmethod
    def open(cls, url: str) -> CatalogBridge:
        from controlplane.catalog.api import open_catalog

        return cls(open_catalog(url))

    def close(self) -> None:
        self.catalog.close()

    def regions(self) -> list[RegionInfo]:
        return [RegionInfo(r.name, r.jurisdiction) for r in self.catalog.list_regions()]

    def placements(self) -> list[PlacementInfo]:
        return [
            PlacementInfo(
                dataset=p.dataset,
                policy=p.policy,
                dataset_class=p.dataset_class,
                home=p.home,
                replicas=tuple(p.replicas),
                residency=tuple(p.residency),
                failover_mode=p.failover_mode,
                failover_order=tuple(p.failover_order),
            )
            for p in self.catalog.list_placements()
        ]

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
            )
        )

    def since(self, since: datetime | None) -> list[JournalEntry]:
        out = []
        for r in self.catalog.list_failovers(since):
            try:
                details = json.loads(r.details) if r.details else {}
            except ValueError:
                details = {"text": r.details}
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
                    details=details if isinstance(details, dict) else {"value": details},
                )
            )
        return out

    def locations(self, dataset: str) -> list[dict[str, Any]]:
        """Where each version of each object of `dataset` lives (the audit query)."""
        from controlplane.catalog.audit import dataset_locations

        with self.catalog.session() as s:
            return dataset_locations(s, dataset)

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        return [
            f"{v.object}@{v.version}" for v in self.catalog.incomplete_versions(dataset, region)
        ]
