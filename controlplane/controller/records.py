"""The controller's catalog-backed records, kept through a catalog outage.

Decisions come from etcd; the catalog only records them. So a catalog error must
never undo or block a decision: `CatalogRecords` wraps the catalog's journal and
catch-up probe for the controller's moves.

* `incomplete_versions` (a move's RPO exposure): when the catalog cannot answer,
  the move goes ahead, and its journal row says the exposure is unknown
  (`details.rpo_versions_unknown`) instead of claiming 0.
* `append`: when the catalog refuses the row, it is kept in memory, in order, and
  `flush()` (the journal duty, with backoff) writes it once the catalog is back.
  Appends are idempotent on the row id, so a row written twice is harmless.
* `missing` is passed through (the backfill duty retries it).

Methods are synchronous (called through `asyncio.to_thread`) and thread-safe.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from datetime import datetime

from controlplane.controller.duty import describe, is_retriable
from controlplane.coordination.catalog_glue.sources import (
    CatchUpProbe,
    FailoverJournal,
    JournalEntry,
)
from controlplane.errors import MeridianError
from controlplane.logs import get_logger

log = get_logger("meridian.controller")


class CatalogRecords:
    """`FailoverJournal` and `CatchUpProbe` that survive a catalog outage (see above)."""

    def __init__(self, journal: FailoverJournal, probe: CatchUpProbe | None) -> None:
        self._journal = journal
        self._probe = probe
        self._lock = threading.Lock()
        self._pending: dict[str, JournalEntry] = {}  # insertion order = move order
        # Rows the catalog refused for good (kept for the logs and a later look).
        self.refused: dict[str, JournalEntry] = {}
        self._deferred_at: dict[str, float] = {}  # id -> time.monotonic() first deferred
        self._unknown_rpo: dict[tuple[str, str], str] = {}  # (dataset, region) -> error

    # -- CatchUpProbe -------------------------------------------------------------------------
    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        if self._probe is None:
            return []
        try:
            return self._probe.incomplete_versions(dataset, region)
        except Exception as exc:  # noqa: BLE001 - a record must not block a decision
            with self._lock:
                self._unknown_rpo[(dataset, region)] = describe(exc)
            log.warning(
                "rpo_unknown",
                dataset=dataset,
                region=region,
                error=describe(exc),
                retriable=is_retriable(exc),
            )
            return []

    # -- FailoverJournal ------------------------------------------------------------------------
    def append(self, entry: JournalEntry) -> None:
        with self._lock:
            why = self._unknown_rpo.pop((entry.dataset, entry.to_region), None)
        if why is not None:
            entry = dataclasses.replace(
                entry,
                details={**entry.details, "rpo_versions_unknown": True, "rpo_error": why},
            )
        try:
            self._journal.append(entry)
        except Exception as exc:  # noqa: BLE001 - kept and written when the catalog is back
            with self._lock:
                self._pending.setdefault(entry.id, entry)
                self._deferred_at.setdefault(entry.id, time.monotonic())
                waiting = len(self._pending)
            log.warning(
                "journal_deferred",
                id=entry.id,
                dataset=entry.dataset,
                error=describe(exc),
                retriable=is_retriable(exc),
                pending=waiting,
            )

    def append_now(self, entry: JournalEntry) -> None:
        """Append without deferring: raises what the catalog raised."""
        self._journal.append(entry)

    def since(self, since: datetime | None) -> list[JournalEntry]:
        return self._journal.since(since)

    def missing(self, ids: Sequence[str]) -> set[str]:
        return self._journal.missing(ids)

    # -- catching up --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_ids(self) -> set[str]:
        with self._lock:
            return set(self._pending)

    def flush(self) -> int:
        """Write the deferred rows in order; how many. A row the catalog refuses for a
        reason that retrying will not fix (a Meridian error that is not `retriable`) is
        set aside in `refused`, logged, and the rest go on; any other error stops the
        flush (raising it), keeping the rest for the next one."""
        written = 0
        while True:
            with self._lock:
                if not self._pending:
                    return written
                jid, entry = next(iter(self._pending.items()))
            try:
                self._journal.append(entry)
            except MeridianError as exc:
                if exc.retriable:
                    raise
                with self._lock:
                    self._pending.pop(jid, None)
                    self._deferred_at.pop(jid, None)
                    self.refused[jid] = entry
                log.error(
                    "journal_row_refused",
                    id=jid,
                    dataset=entry.dataset,
                    epoch=entry.epoch,
                    error=describe(exc),
                    kept=len(self.refused),
                )
                continue
            with self._lock:
                self._pending.pop(jid, None)
                since = self._deferred_at.pop(jid, time.monotonic())
            written += 1
            log.info(
                "journal_caught_up",
                id=jid,
                dataset=entry.dataset,
                epoch=entry.epoch,
                deferred_s=round(time.monotonic() - since, 3),
            )
