"""Journal duty: every committed move gets its catalog row, whatever the catalog did.

For the controller's whole life (not one term), two loops:

* `flush` writes the rows `CatalogRecords` deferred during a catalog outage, in
  order, retrying with backoff until the catalog takes them;
* `backfill` (while active) rebuilds the row of a move into this region that no
  one journaled: a mover (a controller or a runbook) that crashed between winning
  the ownership transaction and appending its row. The owner record keeps the
  move's kind, source, reason, actor and time, and row ids are deterministic
  (`dataset@epoch`), so the rebuilt row is the one that was lost. A row is only
  rebuilt once it has been missing for `journal_grace_s`, so a mover still about
  to write it (with its RPO exposure) is not pre-empted, and never while this
  controller itself holds it deferred. The move a later one displaced is rebuilt
  too, from etcd's history of the owner key (`epoch_before` is the revision that
  wrote it): a mover that died before its row, followed by a failover away from
  its target within the grace, must not leave the first move out of the journal.
  History compacted away (etcd keeps an hour in deploy/) leaves that row unbuilt.
"""

from __future__ import annotations

import asyncio
import time

from controlplane.controller.config import ControllerContext
from controlplane.controller.duty import Duty, Loop, describe
from controlplane.coordination.catalog_glue.sources import journal_id
from controlplane.coordination.orchestration.journal import backfilled_entry
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import CorruptRecordError, Owner, decode_owner
from controlplane.coordination.protocols.view import read_view
from controlplane.errors import NotFoundError
from controlplane.logs import get_logger

log = get_logger("meridian.controller")


class JournalDuty(Duty):
    name = "journal"

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx.config.region, **ctx.retry())
        self.ctx = ctx
        self._next_check = 0.0
        self._missing_since: dict[str, float] = {}
        # Displaced records already settled: journaled, a claim (no row), or compacted.
        self._displaced_settled: set[str] = set()

    def loops(self) -> dict[str, Loop]:
        return {"flush": self._flush_loop, "backfill": self._backfill_loop}

    async def _flush_loop(self) -> None:
        records = self.ctx.records
        while True:
            self.ctx.metrics.journal_deferred.set(records.pending)
            if records.pending:
                try:
                    await asyncio.to_thread(records.flush)
                finally:
                    self.ctx.metrics.journal_deferred.set(records.pending)
            await asyncio.sleep(self.ctx.config.journal_flush_interval_s)

    async def _backfill_loop(self) -> None:
        while True:
            await self.backfill()
            await asyncio.sleep(self.ctx.config.reconcile_interval_s)

    async def backfill(self, *, force: bool = False, now: float | None = None) -> int:
        """Journal every move into this region whose row is missing, and the move each
        of them displaced if its row is missing too; how many.

        `force` skips the check interval; `now` (a `time.monotonic()` value) lets
        tests age rows. Does nothing while the controller is not active."""
        if self.ctx.term is None:
            return 0
        now = time.monotonic() if now is None else now
        if not force and now < self._next_check:
            return 0
        self._next_check = now + self.ctx.config.journal_check_interval_s
        view = await read_view(self.ctx.coord)
        me = self.ctx.config.region
        moves = {
            journal_id(d, o.epoch): o
            for d, o in view.owners.items()
            if o.region == me and o.kind is not None
        }
        displaced = {
            journal_id(d, o.epoch_before): (d, o.epoch_before)
            for d, o in view.owners.items()
            if o.region == me and o.kind is not None and o.epoch_before > 0
        }
        self._displaced_settled &= displaced.keys()  # forget those no record displaces now
        displaced = {i: d for i, d in displaced.items() if i not in self._displaced_settled}
        records = self.ctx.records
        wanted = [*moves, *(i for i in displaced if i not in moves)]
        missing = await asyncio.to_thread(records.missing, wanted) if wanted else set()
        self._displaced_settled.update(i for i in displaced if i not in missing)
        unread: set[str] = set()  # read again at the next check, their grace running on
        for jid in sorted(missing & displaced.keys()):
            try:
                found = await self._displaced_move(*displaced[jid])
            except Exception as exc:  # noqa: BLE001 - one unreadable record must not stop the pass
                log.warning("journal_displaced_move_unread", id=jid, error=describe(exc))
                unread.add(jid)
                continue
            if found is None:
                self._displaced_settled.add(jid)
                missing.discard(jid)
            else:
                moves[jid] = found
        missing -= records.pending_ids()  # ours, with their full facts, to be flushed
        self._missing_since = {i: t for i, t in self._missing_since.items() if i in missing}
        written = 0
        for jid in sorted(missing):
            first = self._missing_since.setdefault(jid, now)
            if now - first < self.ctx.config.journal_grace_s or jid in unread:
                continue
            entry = backfilled_entry(moves[jid], self.ctx.actor)
            try:
                # Straight to the catalog: a rebuilt row that fails is rebuilt again at
                # the next check, it need not wait in the deferred queue.
                await asyncio.to_thread(records.append_now, entry)
            except Exception as exc:  # noqa: BLE001 - retried on the next check
                log.warning("journal_backfill_failed", id=jid, error=describe(exc))
                continue
            del self._missing_since[jid]
            if jid in displaced:
                self._displaced_settled.add(jid)
            written += 1
            log.warning(
                "journal_backfilled",
                dataset=entry.dataset,
                epoch=entry.epoch,
                kind=entry.kind,
                from_region=entry.from_region,
                to=entry.to_region,
            )
        return written

    async def _displaced_move(self, dataset: str, epoch: int) -> Owner | None:
        """The owner record `dataset` had at `epoch`, read from the owner key's history;
        None when it was no move (a home region's claim) or etcd no longer keeps that
        revision."""
        try:
            kv = await self.ctx.coord.get(keys.owner(dataset), revision=epoch)
        except NotFoundError as exc:
            log.warning(
                "journal_displaced_move_compacted",
                dataset=dataset,
                epoch=epoch,
                error=describe(exc),
            )
            return None
        if kv is None or kv.mod_revision != epoch:
            return None
        try:
            owner = decode_owner(dataset, kv.value, kv.mod_revision, None)
        except CorruptRecordError as exc:  # nothing to rebuild a row from, ever
            log.warning("journal_displaced_move_unreadable", dataset=dataset, error=str(exc))
            return None
        return owner if owner.kind is not None else None
