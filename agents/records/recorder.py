"""The recorder: ships the store's journal to the catalog (dataplane.md, *Records*).

In journal order, a bounded batch at a time (see loop.py): each record becomes its
catalog facts (journal.py), the batch's facts are written in ONE catalog
transaction (`Catalog.record_holdings`), then `journal_shipped` moves the store's
position past the batch. A crash between the catalog's commit and that move ships
the batch again, which changes nothing (every fact is idempotent, see journal.py).
While the catalog is unreachable the recorder backs off and retries; the store's
writes never wait for it, and the journal keeps every record until it is shipped.

A record the catalog refuses as bad input (`InvalidInputError`: it names a region
the catalog does not know, a digest conflicting with the one registered, a dataset
new to a catalog opened without a placer while a policy is applied) fails its
batch's transaction; the batch is then shipped one record at a time, and that
record is set aside
with its reason in `ROOT/records-set-aside.jsonl` (setaside.py) and counted, and
the queue moves on: one bad record must not stop every later one from reaching
the catalog, nor be dropped without trace. Any other failure is the catalog's, not
the record's (a permission revoked, a read-only file, a schema older than the
agent): nothing is set aside and the batch is retried with backoff, or the whole
journal would drain into the file, with the catalog none the wiser. A record that
cannot be planned is set aside only with its batch's commit (a retried batch would
set it aside again). Datasets the catalog has not seen are
registered on the way (the agent admitted the write under an applied policy, so
the catalog's placer places them), not set aside.

`meridian_records_behind_seconds` is read from the journal itself when scraped:
the age of the oldest record not yet shipped, 0 when caught up; so it is right at
once after a restart, and it keeps rising through an outage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from agents.metrics import AgentMetrics
from agents.records.journal import Plan, plan
from agents.records.loop import BatchDuty, log
from agents.records.setaside import SetAside
from agents.records.settings import RecorderSettings
from agents.store.model import JournalEntry, JsonValue
from agents.store.store import ObjectStore
from controlplane.catalog.api import Catalog
from controlplane.controller.duty import describe
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError

SET_ASIDE_FILE = "records-set-aside.jsonl"


class Recorder(BatchDuty):
    name = "recorder"

    def __init__(
        self,
        store: ObjectStore,
        catalog: Catalog,
        metrics: AgentMetrics,
        region: str,
        settings: RecorderSettings | None = None,
    ) -> None:
        settings = settings or RecorderSettings()
        super().__init__(
            region,
            batch_size=settings.batch_size,
            idle_interval_s=settings.idle_interval_s,
            retry_initial_s=settings.retry_initial_s,
            retry_max_s=settings.retry_max_s,
            stop_timeout_s=settings.stop_timeout_s,
        )
        self._store = store
        self._catalog = catalog
        self._metrics = metrics
        self.set_aside = SetAside(store.root / SET_ASIDE_FILE)
        self._behind = 0.0
        metrics.records_behind.set_function(self.behind_seconds)

    def behind_seconds(self) -> float:
        """Age of the oldest journal record not yet shipped (0 when caught up)."""
        try:
            oldest = self._store.journal_pending(limit=1)
        except MeridianError:
            return self._behind  # the store is closing: the last value read
        now_ms = time.time_ns() // 1_000_000
        self._behind = max(0.0, (now_ms - oldest[0].at_ms) / 1000) if oldest else 0.0
        return self._behind

    async def step(self) -> int:
        return await asyncio.to_thread(self.ship_pending)

    def ship_pending(self, *, mark: bool = True) -> int:
        """Ship the next batch of the journal (blocking); return how many records were
        handled. `mark=False` leaves the store's position where it was, as a crash
        right after the catalog's commit would (the tests replay with it)."""
        entries = self._store.journal_pending(limit=self.batch_size)
        if not entries:
            return 0
        plans: list[tuple[JournalEntry, Plan | InvalidInputError]] = []
        for entry in entries:
            try:
                plans.append((entry, plan(self.region, entry, self._lookup)))
            except InvalidInputError as exc:  # malformed: shipping it would fail the same way
                plans.append((entry, exc))
        whole = Plan()
        for _, one in plans:
            if isinstance(one, Plan):
                whole.extend(one)
        try:
            self._record(whole)
        except InvalidInputError:
            # The catalog refused one of them (nothing of the batch committed): ship them
            # one at a time to set that one aside and keep the rest.
            self._one_by_one(plans, mark=mark)
        else:
            for entry, one in plans:
                if isinstance(one, InvalidInputError):
                    self._set_aside(entry, one)
        if mark:
            self._store.journal_shipped(entries[-1].seq)
        self._metrics.records_shipped.inc(len(entries))
        log.debug(
            "records_shipped",
            region=self.region,
            records=len(entries),
            first_seq=entries[0].seq,
            last_seq=entries[-1].seq,
        )
        return len(entries)

    def _one_by_one(
        self, plans: list[tuple[JournalEntry, Plan | InvalidInputError]], *, mark: bool
    ) -> None:
        done: JournalEntry | None = None
        for entry, one in plans:
            try:
                if isinstance(one, InvalidInputError):
                    raise one
                self._record(one)
            except InvalidInputError as exc:
                self._set_aside(entry, exc)
            except MeridianError:
                if done is not None and mark:
                    self._store.journal_shipped(done.seq)  # what reached the catalog
                raise
            done = entry

    def _record(self, facts: Plan) -> None:
        if facts.versions or facts.holdings or facts.transfers:
            self._catalog.record_holdings(facts.versions, facts.holdings, facts.transfers)

    def _set_aside(self, entry: JournalEntry, exc: MeridianError) -> None:
        self.set_aside.keep("journal", _as_json(entry), describe(exc))
        self._metrics.records_set_aside.labels(queue="journal").inc()

    def _lookup(self, dataset: str, key: str, hlc: str) -> Version | None:
        try:
            return self._store.stat(dataset, key, hlc, include_deleted=True).version
        except NotFoundError:
            return None


def _as_json(entry: JournalEntry) -> dict[str, JsonValue]:
    return dict(dataclasses.asdict(entry))
