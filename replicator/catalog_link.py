"""The replicator's catalog, opened when first needed and again after a failure.

A replicator started during a catalog outage must still apply events (the data path
never waits for the catalog): the daemon starts with the catalog closed when it is
merely unreachable, and the first record shipped or backlog probe opens it. An error
that will not clear by itself (a malformed URL, a catalog never migrated) stops the
start instead. Implements `ports.ReplicaRecords` and `backlog.BacklogSource`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.records import Placement, ReplicaStatus, TransferRecord, VersionRef
from controlplane.policy.placer import place


class CatalogLink:
    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._catalog: Catalog | None = None

    def open(self) -> Catalog:
        with self._lock:
            if self._catalog is None:
                self._catalog = open_catalog(self._url, placer=place)
            return self._catalog

    def close(self) -> None:
        with self._lock:
            catalog, self._catalog = self._catalog, None
        if catalog is not None:
            catalog.close()

    # -- ReplicaRecords ------------------------------------------------------------------
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
    ) -> None:
        self.open().register_version(
            dataset,
            key,
            version,
            digest,
            size=size,
            origin_region=origin_region,
            created_at=created_at,
            hlc=hlc,
            op=op,
            set_id=set_id,
        )

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
    ) -> None:
        self.open().set_replica_state(
            dataset,
            key,
            version,
            region,
            state,
            digest=digest,
            error=error,
            attempted_at=attempted_at,
        )

    def record_transfer(self, rec: TransferRecord) -> None:
        self.open().record_transfer(rec)

    # -- BacklogSource -------------------------------------------------------------------
    def list_placements(self) -> list[Placement]:
        return self.open().list_placements()

    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None:
        return self.open().oldest_incomplete_at(dataset, regions)

    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]:
        return self.open().incomplete_versions(dataset, region)

    def replica_status(
        self, dataset: str, *, region: str | None = None, states: Sequence[str] | None = None
    ) -> list[ReplicaStatus]:
        return self.open().replica_status(dataset, region=region, states=states)

    def dataset_locations(self, name: str) -> list[dict[str, Any]]:
        return self.open().dataset_locations(name)

    def holders(self, dataset: str, key: str, version: str) -> list[str]:
        return self.open().holders(dataset, key, version)
