"""The controller's link to the catalog, opened when first needed and again after a failure.

A controller started (or restarted by its supervisor) during a catalog outage
must still take its region's lease: decisions need only etcd. So the daemon
tries the catalog once at start, refuses to start only on an error that will not
clear by itself (a malformed URL, a catalog that was never migrated), and
otherwise starts with the catalog closed; the first journal write or probe opens
it, and `CatalogRecords` defers what fails meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.coordination.catalog_glue.sources import JournalEntry


class CatalogLink:
    """`FailoverJournal` and `CatchUpProbe` on a catalog opened on demand (thread-safe)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._bridge: CatalogBridge | None = None

    def open(self) -> CatalogBridge:
        """The open catalog; opens it now if needed (raising what opening raised)."""
        with self._lock:
            if self._bridge is None:
                self._bridge = CatalogBridge.open(self._url)
            return self._bridge

    def close(self) -> None:
        with self._lock:
            bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()

    def append(self, entry: JournalEntry) -> None:
        self.open().append(entry)

    def since(self, since: datetime | None) -> list[JournalEntry]:
        return self.open().since(since)

    def missing(self, ids: Sequence[str]) -> set[str]:
        return self.open().missing(ids)

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        return self.open().incomplete_versions(dataset, region)
