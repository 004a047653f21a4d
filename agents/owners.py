"""Owners, epochs and handover marks of datasets, read from etcd for the agent's admission.

`EtcdOwners` is the `agents.admission.OwnerSource` the daemon wires. It reads every
owner record (`/meridian/owners/`) and handover mark (`/meridian/handover/`) in one
transaction, then follows both prefixes with watches, and feeds what it learns to
the agent's `FencedResource` (so replica-side checks know the newest epoch and
every marked handover).

Why `owner()` still re-reads: a watch that says nothing may be healthy or may be
stuck behind a partition, and only a read can tell. So each record remembers when
etcd last vouched for it (a read, or a watch event), and `owner()` re-reads a
dataset whose record is older than `max_age_s` (one transaction for both keys).
A critical write therefore decides on state at most `max_age_s` old, and on none
when etcd cannot be reached: `UnavailableError`, the write fails closed. A
handover freezes writes with its mark before it moves ownership; as long as that
freeze lasts longer than `max_age_s`, no write at the old epoch is accepted once
the move has committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.admission import OwnerRecord
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import (
    CorruptRecordError,
    decode_handover,
    decode_owner,
)
from controlplane.errors import MeridianError, UnavailableError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination, EventType, Get, KeyValue

log = get_logger("meridian.agent.owners")

DEFAULT_MAX_AGE_S = 0.5


@dataclass(slots=True)
class _Entry:
    region: str | None  # None: no owner record
    epoch: int
    mark_epoch: int | None  # the epoch a handover mark froze, None without a mark
    checked_at: float  # monotonic time etcd last vouched for it

    @property
    def frozen(self) -> bool:
        # A mark freezes the epoch it was written at; one of an older epoch is stale.
        return self.mark_epoch is not None and self.mark_epoch >= self.epoch

    def record(self, dataset: str) -> OwnerRecord | None:
        if self.region is None:
            return None
        return OwnerRecord(dataset, self.region, self.epoch, self.frozen)


class EtcdOwners(Lifecycle):
    """The owner records of etcd, watched, with bounded-age reads (module docstring)."""

    def __init__(
        self,
        coord: Coordination,
        fence: FencedResource,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coord = coord
        self._fence = fence
        self.max_age_s = max_age_s
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._revision = 0
        self._tasks: list[asyncio.Task[None]] = []

    # -- the OwnerSource port --------------------------------------------------------

    async def owner(self, dataset: str) -> OwnerRecord | None:
        entry = self._entries.get(dataset)
        if entry is not None and self._clock() - entry.checked_at <= self.max_age_s:
            return entry.record(dataset)
        return await self.read(dataset)

    def known(self, dataset: str) -> OwnerRecord | None:
        entry = self._entries.get(dataset)
        return None if entry is None else entry.record(dataset)

    async def read(self, dataset: str) -> OwnerRecord | None:
        """Read the owner record and handover mark of `dataset` from etcd now."""
        started = self._clock()
        try:
            res = await self._coord.txn([], [Get(keys.owner(dataset)), Get(keys.handover(dataset))])
        except MeridianError as exc:
            log.warning("owner_read_failed", dataset=dataset, error=str(exc))
            raise UnavailableError(
                f"the owner of critical dataset {dataset} cannot be read from etcd ({exc}); "
                "the write is refused until etcd answers"
            ) from exc
        owner_kvs, mark_kvs = res.reads
        entry = _Entry(None, 0, None, started)
        try:
            if owner_kvs:
                self._set_owner(entry, dataset, owner_kvs[0])
            if mark_kvs:
                self._set_mark(entry, mark_kvs[0])
        except CorruptRecordError as exc:
            log.error("owner_record_unreadable", dataset=dataset, error=str(exc))
            self._entries.pop(dataset, None)
            raise UnavailableError(
                f"the owner of critical dataset {dataset} cannot be decided: {exc}"
            ) from exc
        self._store(dataset, entry)
        return entry.record(dataset)

    # -- lifecycle -------------------------------------------------------------------

    async def _do_start(self) -> None:
        await self._read_all()
        self._tasks = [
            asyncio.create_task(self._follow(keys.OWNERS), name="owners-watch"),
            asyncio.create_task(self._follow(keys.HANDOVER), name="handover-watch"),
        ]

    async def _do_stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)

    # -- following -------------------------------------------------------------------

    async def _read_all(self) -> int:
        started = self._clock()
        res = await self._coord.txn(
            [], [Get(keys.OWNERS, prefix=True), Get(keys.HANDOVER, prefix=True)]
        )
        owner_kvs, mark_kvs = res.reads
        fresh: dict[str, _Entry] = {}
        corrupt: set[str] = set()
        for prefix, kvs in ((keys.OWNERS, owner_kvs), (keys.HANDOVER, mark_kvs)):
            for kv in kvs:
                dataset = kv.key.removeprefix(prefix)
                entry = fresh.setdefault(dataset, _Entry(None, 0, None, started))
                try:
                    if prefix == keys.OWNERS:
                        self._set_owner(entry, dataset, kv)
                    else:
                        self._set_mark(entry, kv)
                except CorruptRecordError as exc:
                    log.error("owner_record_unreadable", key=kv.key, error=str(exc))
                    corrupt.add(dataset)
        # Datasets known before but absent now lost their records meanwhile.
        for dataset in self._entries.keys() - fresh.keys():
            fresh[dataset] = _Entry(None, 0, None, started)
        for dataset, entry in fresh.items():
            if dataset in corrupt:
                # Decides nothing: forgotten, so a write re-reads (and is refused).
                self._entries.pop(dataset, None)
            else:
                self._store(dataset, entry)
        self._revision = res.revision
        return res.revision

    async def _follow(self, prefix: str) -> None:
        delay = self._retry_initial_s
        start = self._revision + 1
        while True:
            try:
                async for ev in self._coord.watch(prefix, prefix=True, start_revision=start):
                    self._event(prefix, ev.type, ev.kv)
                    start = ev.revision + 1
                    delay = self._retry_initial_s
                start = await self._read_all() + 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd down, history compacted: go on
                log.warning(
                    "owners_watch_retry",
                    prefix=prefix,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=round(delay, 3),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                with contextlib.suppress(Exception):
                    # A fresh read, so history compacted meanwhile is not needed.
                    start = await self._read_all() + 1

    def _event(self, prefix: str, kind: EventType, kv: KeyValue) -> None:
        dataset = kv.key.removeprefix(prefix)
        old = self._entries.get(dataset)
        entry = _Entry(
            old.region if old else None,
            old.epoch if old else 0,
            old.mark_epoch if old else None,
            self._clock(),
        )
        try:
            if prefix == keys.OWNERS:
                if kind is EventType.DELETE:
                    entry.region, entry.epoch = None, 0
                else:
                    self._set_owner(entry, dataset, kv)
            elif kind is EventType.DELETE:
                entry.mark_epoch = None
            else:
                self._set_mark(entry, kv)
        except CorruptRecordError as exc:
            log.error("owner_record_unreadable", key=kv.key, error=str(exc))
            # An unreadable record decides nothing: forget it, so the next write re-reads.
            self._entries.pop(dataset, None)
            return
        self._store(dataset, entry)

    # -- records -----------------------------------------------------------------------

    @staticmethod
    def _set_owner(entry: _Entry, dataset: str, kv: KeyValue) -> None:
        try:
            owner = decode_owner(dataset, kv.value, kv.mod_revision, None)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptRecordError(
                f"the owner record {kv.key} (revision {kv.mod_revision}) is unreadable: {exc}"
            ) from exc
        # A move deletes the mark in the same transaction; its event may come later.
        if entry.mark_epoch is not None and entry.mark_epoch < owner.epoch:
            entry.mark_epoch = None
        entry.region, entry.epoch = owner.region, owner.epoch

    @staticmethod
    def _set_mark(entry: _Entry, kv: KeyValue) -> None:
        entry.mark_epoch = decode_handover(kv).epoch

    def _store(self, dataset: str, entry: _Entry) -> None:
        self._entries[dataset] = entry
        if entry.region is not None:
            self._fence.observe(dataset, entry.epoch, handing_over=entry.frozen)
