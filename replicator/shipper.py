"""Ships the replicator's record journal to the catalog, in order, idempotently.

While the catalog is down the rows wait in the journal (the data path goes on) and
the shipper retries with backoff; a row the catalog refuses for good (an input
error, such as a replica that is already `completed` by the agent's own records
when a late `pending` arrives) is logged and dropped, so one row cannot block the
rest for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from controlplane.catalog.records import TransferRecord
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from replicator.journal import JournalRow, RecordJournal, ReplicaRecord
from replicator.ports import ReplicaRecords

log = get_logger("meridian.replicator.shipper")


def ship_one(sink: ReplicaRecords, rec: ReplicaRecord) -> None:
    """Write one journal row to the catalog (each write idempotent)."""
    if rec.op == "set":
        # A version set's refusal: the catalog keeps no sets, so only the refused
        # transfer, of `/set/<id>` (no object name starts with "/").
        if rec.kind == "refused":
            sink.record_transfer(_refused(rec, f"/set/{rec.set_id}"))
        return
    sink.register_version(
        rec.dataset,
        rec.key,
        rec.hlc,
        rec.digest,
        size=rec.size,
        origin_region=rec.origin_region,
        hlc=rec.hlc,
        op=rec.op,
        set_id=rec.set_id,
    )
    if rec.kind == "refused":
        sink.record_transfer(_refused(rec, rec.key))
        return
    sink.set_replica_state(
        rec.dataset,
        rec.key,
        rec.hlc,
        rec.region,
        rec.state,
        digest=(rec.digest or None) if rec.state == "completed" else None,
        error=rec.error,
        attempted_at=rec.at if rec.attempted else None,
    )


def _refused(rec: ReplicaRecord, name: str) -> TransferRecord:
    return TransferRecord(
        id=f"refused:{rec.event_id}:{rec.region}",
        dataset=rec.dataset,
        object=name,
        version=rec.hlc,
        from_region=rec.origin_region,
        to_region=rec.region,
        logical_bytes=rec.size,
        wire_bytes=0,
        outcome="refused",
        at=rec.at,
        policy_revision=rec.policy_revision,
    )


def _ship_rows(sink: ReplicaRecords, rows: list[JournalRow], seqs: list[int]) -> None:
    """Ship `rows` in order, appending each one's seq to `seqs` once it is settled; a
    retriable error stops the batch (raised), a final one drops its row (logged)."""
    for row in rows:
        try:
            ship_one(sink, row.record)
        except MeridianError as exc:
            if exc.retriable:
                raise
            log.warning(
                "record_dropped",
                dataset=row.record.dataset,
                key=row.record.key,
                version=row.record.hlc,
                region=row.record.region,
                state=row.record.state,
                error=str(exc),
                action="the catalog refused it for good; it is not retried",
            )
        seqs.append(row.seq)


class RecordShipper(Lifecycle):
    def __init__(
        self,
        journal: RecordJournal,
        sink: ReplicaRecords | None,
        *,
        interval_s: float = 0.2,
        retry_max_s: float = 5.0,
        batch: int = 200,
    ) -> None:
        self._journal = journal
        self._sink = sink
        self._interval_s = interval_s
        self._retry_max_s = retry_max_s
        self._batch = batch
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.shipped = 0

    def nudge(self) -> None:
        """New rows were appended: ship them soon."""
        self._wake.set()

    async def _do_start(self) -> None:
        if self._sink is not None:
            self._task = asyncio.create_task(self._run(), name="replicator-shipper")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        self._task = None

    async def ship_once(self) -> int:
        """Ship what the journal holds now; the number of rows shipped (or dropped)."""
        if self._sink is None:
            return 0
        done = 0
        while rows := await asyncio.to_thread(self._journal.pending, self._batch):
            # One thread hop per batch; the rows shipped before a failure are forgotten
            # even when a later one raises, so nothing is shipped twice needlessly.
            seqs: list[int] = []
            try:
                await asyncio.to_thread(_ship_rows, self._sink, rows, seqs)
            finally:
                await asyncio.to_thread(self._journal.shipped, seqs)
                done += len(seqs)
                self.shipped += len(seqs)
        return done

    async def _run(self) -> None:
        delay = self._interval_s
        while True:
            try:
                await self.ship_once()
                delay = self._interval_s
            except MeridianError as exc:
                log.warning(
                    "catalog_unreachable",
                    error=str(exc),
                    waiting=self._journal.count(),
                    action=f"records wait in {self._journal.path}; retrying",
                )
                delay = min(self._retry_max_s, max(self._interval_s, delay * 2))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay * random.uniform(0.8, 1.2))  # noqa: S311
