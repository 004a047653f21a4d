"""The owners of critical datasets as this agent knows them, and the fence they feed.

`OwnershipWatch` reads every owner (`/meridian/owners/`) and handover mark
(`/meridian/handover/`) in one transaction, then watches both prefixes from that
read's revision, so nothing between the read and the watch is missed. For each
change it updates its map (dataset → `Owner`, with `handing_over_to` set while a
mark exists) and the agent's `FencedResource`: an owner write raises the epoch (an
older writer is then refused), a mark freezes the dataset at its epoch, its removal
unfreezes it at the epoch then current.

Admission asks `owner(dataset)`: which region may write a critical dataset, at
which epoch, and whether it is handing over; the servicer attaches that epoch to a
client write that gave none (spec/cli.md: "the owner's agent attaches its epoch").

When etcd is unreachable the map keeps what it knew (the fence only ever learns
newer epochs, so a replica stays safe) and the watch is re-established with
backoff, from a fresh read. `start()` does the first read and raises
`UnavailableError` if etcd does not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import (
    CorruptRecordError,
    Owner,
    decode_handover,
    decode_owner,
)
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination, EventType, Get, KeyValue

log = get_logger("meridian.agent")


class OwnershipWatch(Lifecycle):
    """A watched map of dataset owners (see the module docstring)."""

    def __init__(
        self,
        coord: Coordination,
        fence: FencedResource,
        *,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self.coord = coord
        self.fence = fence
        self._retry = (retry_initial_s, retry_max_s)
        self._owners: dict[str, Owner] = {}
        self._marks: dict[str, str] = {}  # dataset -> region it is handed over to
        self._revision = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Told each owner record read or watched (the agent starts a takeover pass when
        # its own region is named at a new epoch); it must not block.
        self.on_owner: Callable[[Owner], None] | None = None

    # -- questions -------------------------------------------------------------------
    def owners(self) -> list[Owner]:
        """Every owner record known (as last read or watched)."""
        return list(self._owners.values())

    def owner(self, dataset: str) -> Owner | None:
        """The dataset's owner, epoch and handover state, or None when unowned."""
        found = self._owners.get(dataset)
        if found is None:
            return None
        to = self._marks.get(dataset)
        if to == found.handing_over_to:
            return found
        return Owner(
            dataset=found.dataset,
            region=found.region,
            epoch=found.epoch,
            reason=found.reason,
            actor=found.actor,
            at=found.at,
            handing_over_to=to,
            kind=found.kind,
            from_region=found.from_region,
            epoch_before=found.epoch_before,
        )

    def epoch(self, dataset: str) -> int | None:
        found = self._owners.get(dataset)
        return None if found is None else found.epoch

    @property
    def revision(self) -> int:
        """The etcd revision the map is up to date with."""
        return self._revision

    async def wait_for_revision(self, revision: int, timeout_s: float) -> None:
        """Until the map has seen `revision` (for tests and tools);
        `TimeoutError` after `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while self._revision < revision:
                self._changed.clear()
                await self._changed.wait()

    # -- lifecycle -------------------------------------------------------------------
    async def _do_start(self) -> None:
        await self._read()
        self._task = asyncio.create_task(self._follow(), name="ownership-watch")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    # -- following -------------------------------------------------------------------
    async def _read(self) -> None:
        res = await self.coord.txn(
            [], [Get(keys.OWNERS, prefix=True), Get(keys.HANDOVER, prefix=True)]
        )
        owners_kv, marks_kv = res.reads
        marks: dict[str, str] = {}
        for kv in marks_kv:
            ds, to, _epoch = self._decode_mark(kv)
            marks[ds] = to
        owners: dict[str, Owner] = {}
        for kv in owners_kv:
            found = self._decode_owner(kv)
            if found is not None:
                owners[found.dataset] = found
        # Replace both maps at once: a reader sees one read, never half of it.
        self._owners, self._marks = owners, marks
        # Advanced with the maps, before any listener is told: one that reads the
        # revision sees the one the maps are as of (waiters run after, at an await).
        self._advance(res.revision)
        for ds, found in owners.items():
            self.fence.observe(ds, found.epoch, handing_over=ds in marks, revision=res.revision)
            self._tell(found)

    async def _follow(self) -> None:
        delay = self._retry[0]
        while True:
            try:
                await self._watch(self._revision + 1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd away or compacted: re-read
                log.warning(
                    "ownership_watch_retry", error=_describe(exc), retry_in_s=round(delay, 3)
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])
                try:
                    await self._read()
                    delay = self._retry[0]
                except Exception as again:  # noqa: BLE001 - the next round retries
                    log.warning("ownership_read_failed", error=_describe(again))

    async def _watch(self, start: int) -> None:
        # One watch over both prefixes (by their common root), not one each: a move
        # rewrites the owner and deletes the mark in one transaction, and one stream
        # delivers both events together, in revision order, with no await between
        # them, so no reader sees the new owner still marked as handing over.
        async for ev in self.coord.watch(keys.ROOT, prefix=True, start_revision=start):
            key = ev.kv.key
            self._advance(ev.revision)  # before the listeners, as in _read
            if key.startswith(keys.OWNERS):
                self._on_owner(ev.type, key.removeprefix(keys.OWNERS), ev.kv)
            elif key.startswith(keys.HANDOVER):
                self._on_mark(ev.type, key.removeprefix(keys.HANDOVER), ev.kv, ev.revision)

    def _on_owner(self, kind: EventType, ds: str, kv: KeyValue) -> None:
        if kind is EventType.DELETE:
            self._owners.pop(ds, None)
            return
        found = self._decode_owner(kv)
        if found is not None:
            self._owners[ds] = found
            self.fence.observe(ds, found.epoch)
            self._tell(found)

    def _tell(self, found: Owner) -> None:
        if self.on_owner is not None:
            try:
                self.on_owner(found)
            except Exception as exc:  # noqa: BLE001 - a listener's bug must not stop the watch
                log.warning("owner_listener_failed", dataset=found.dataset, error=str(exc))

    def _on_mark(self, kind: EventType, ds: str, kv: KeyValue, revision: int) -> None:
        if kind is EventType.PUT:
            _ds, to, epoch = self._decode_mark(kv)
            self._marks[ds] = to
            self.fence.observe(
                ds,
                epoch if epoch is not None else self.epoch(ds) or 0,
                handing_over=True,
                revision=revision,
            )
            return
        self._marks.pop(ds, None)
        found = self._owners.get(ds)
        if found is not None:
            # After a completed move the owner event (same revision) came first and
            # the fence already holds the new epoch, unfrozen; after an abort this
            # unfreezes the epoch the mark froze.
            self.fence.observe(ds, found.epoch, handing_over=False, revision=revision)

    def _advance(self, revision: int) -> None:
        self._revision = max(self._revision, revision)
        self._changed.set()

    def _decode_owner(self, kv: KeyValue) -> Owner | None:
        ds = kv.key.removeprefix(keys.OWNERS)
        try:
            return decode_owner(ds, kv.value, kv.mod_revision, None)
        except CorruptRecordError as exc:
            # Not written by Meridian: fail closed for it (no owner: critical writes refused).
            log.error("owner_record_unreadable", dataset=ds, error=str(exc))
            return None

    def _decode_mark(self, kv: KeyValue) -> tuple[str, str, int | None]:
        """(dataset, target region, epoch frozen at); an unreadable mark is still a
        freeze, to an unknown region at an unknown epoch."""
        try:
            mark = decode_handover(kv)
        except CorruptRecordError as exc:
            ds = kv.key.removeprefix(keys.HANDOVER)
            log.error("handover_mark_unreadable", dataset=ds, error=str(exc))
            return ds, "?", None
        return mark.dataset, mark.to_region, mark.epoch


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
