"""Owners, epochs and handover marks of critical datasets, for the agent's admission.

`EtcdOwners` is the `agents.admission.OwnerSource` the daemon wires. A watch alone
is not enough to admit a client's critical write: a watch that says nothing may be
healthy or stuck behind a partition, and only a read can tell. So `owner()`
answers from the newest of two things:

* its own read of the dataset's owner record and handover mark (one etcd
  transaction), reused for at most `max_age_s` and then read again;
* the daemon's watched map (`agents.daemon.owners.OwnershipWatch`, the
  `WatchedOwners` port), when it has seen a later etcd revision than that read
  (a mark or a move it delivered since is used at once).

A critical write therefore decides on etcd state at most `max_age_s` old, and on
none when etcd cannot be reached: `UnavailableError`, the write fails closed. A
handover freezes writes with its mark before it moves ownership; as long as the
freeze outlasts `max_age_s`, no write at the old epoch is accepted once the move
has committed. Every read also feeds the agent's `FencedResource`.

`known()` (for replica-side checks, no I/O) answers from the newer of the watch and
the last read.

`read_fresh()` is the read a replica makes before it commits a pushed copy: a read
of etcd that *began after the call*, so it says what etcd held at some moment after
the copy arrived. Concurrent callers share one such read (each joins the next read to
begin, never one already under way): under load a replica took one etcd transaction
per pushed copy, now one per etcd round trip and dataset, with the same freshness.
`owner_now()` answers with that read, or with anything newer known by then (the
watch, or another read that ended first): a caller that tells the fence what it got
(admission does) never lifts a freeze with an answer older than the freeze.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agents.admission import OwnerRecord
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import (
    CorruptRecordError,
    Owner,
    decode_handover,
    decode_owner,
)
from controlplane.errors import MeridianError, UnavailableError
from controlplane.logs import get_logger
from controlplane.ports.coordination import Coordination, Get

log = get_logger("meridian.agent.owners")

DEFAULT_MAX_AGE_S = 0.5


class WatchedOwners(Protocol):
    """A map of owners kept by a watch (`agents.daemon.owners.OwnershipWatch`)."""

    @property
    def revision(self) -> int:
        """The etcd revision the map is up to date with."""
        ...

    def owner(self, dataset: str) -> Owner | None: ...


@dataclass(frozen=True, slots=True)
class _Read:
    record: OwnerRecord | None
    revision: int  # etcd revision of the read
    at: float  # monotonic time of the read's start


class EtcdOwners:
    """Bounded-age owner reads from etcd, combined with a watched map (module docstring)."""

    def __init__(
        self,
        coord: Coordination,
        fence: FencedResource,
        *,
        watched: WatchedOwners | None = None,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._coord = coord
        self._fence = fence
        self._watched = watched
        self.max_age_s = max_age_s
        self._clock = clock
        self._reads: dict[str, _Read] = {}
        # dataset -> the fresh read callers wait for that has not begun yet / under way.
        self._next: dict[str, asyncio.Future[_Read]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}

    async def owner(self, dataset: str) -> OwnerRecord | None:
        found = self._reads.get(dataset)
        if found is None or self._clock() - found.at > self.max_age_s:
            found = await self.read(dataset)
        return self._newest(dataset, found)

    async def owner_now(self, dataset: str) -> OwnerRecord | None:
        """The owner as etcd holds it now: a read begun after this call (`read_fresh`),
        or what the watch delivered past it meanwhile. A handover marked while the read
        was under way is in the answer: a caller that tells the fence what it got (the
        replica's admission does) must not lift a freeze the watch set after the read."""
        return self._newest(dataset, await self.read_fresh(dataset))

    def _newest(self, dataset: str, found: _Read) -> OwnerRecord | None:
        """`found`, or what is newer: the last read kept (another read, begun and ended
        meanwhile), or the watched record when the watch is past both."""
        kept = self._reads.get(dataset)
        if kept is not None and kept.revision > found.revision:
            found = kept
        watched = self._watched
        if watched is not None and watched.revision > found.revision:
            return _record(watched.owner(dataset), watched.revision)
        return found.record

    def known(self, dataset: str) -> OwnerRecord | None:
        # The newer of the two, as `owner()`: a read that saw a handover mark the watch
        # has not delivered yet froze the fence, and the target's check needs the mark.
        found = self._reads.get(dataset)
        watched = self._watched
        if watched is not None and (found is None or watched.revision > found.revision):
            return _record(watched.owner(dataset), watched.revision)
        return None if found is None else found.record

    async def read_fresh(self, dataset: str) -> _Read:
        """A read of `dataset`'s owner begun after this call (module docstring), shared
        with the callers that arrived before it began."""
        waiting = self._next.get(dataset)
        if waiting is None:
            waiting = self._next[dataset] = asyncio.get_running_loop().create_future()
            if dataset not in self._running:
                self._begin(dataset)
        # Shielded: a caller that gives up does not cancel the others' read.
        return await asyncio.shield(waiting)

    def _begin(self, dataset: str) -> None:
        """Begin the read the waiting callers of `dataset` share; when it ends, the next
        one if callers arrived meanwhile."""

        async def run() -> None:
            # Taken as the read begins: whoever joined until now shares it.
            waiting = self._next.pop(dataset)
            # Retrieved, so that a read nobody awaits any more is not reported unhandled.
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
            try:
                found = await self.read(dataset)
            except Exception as exc:  # noqa: BLE001 - every waiter gets the read's own error
                if not waiting.done():
                    waiting.set_exception(exc)
            except BaseException:  # cancelled (the agent stops): so are its waiters
                waiting.cancel()
                raise
            else:
                if not waiting.done():
                    waiting.set_result(found)
            finally:
                del self._running[dataset]
                if dataset in self._next:
                    self._begin(dataset)

        self._running[dataset] = asyncio.create_task(run(), name=f"owner read {dataset}")

    async def read(self, dataset: str) -> _Read:
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
        record: OwnerRecord | None = None
        try:
            if owner_kvs:
                kv = owner_kvs[0]
                owner = decode_owner(dataset, kv.value, kv.mod_revision, None)
                mark = decode_handover(mark_kvs[0]) if mark_kvs else None
                to = mark.to_region if mark is not None and mark.epoch >= owner.epoch else None
                record = _record(owner, res.revision, handover_to=to)
        except (CorruptRecordError, ValueError, KeyError, TypeError) as exc:
            log.error("owner_record_unreadable", dataset=dataset, error=str(exc))
            self._reads.pop(dataset, None)
            raise UnavailableError(
                f"the owner of critical dataset {dataset} cannot be decided: its record in "
                f"etcd is unreadable ({exc})"
            ) from exc
        found = _Read(record, res.revision, started)
        kept = self._reads.get(dataset)
        if kept is not None and kept.revision > res.revision:
            return found  # an older read ending late: a newer one already told the fence more
        self._reads[dataset] = found
        watched = self._watched
        if record is not None and (watched is None or watched.revision <= res.revision):
            # Only news for the fence: a watch already past this read told it more.
            self._fence.observe(
                dataset, record.epoch, handing_over=record.handing_over, revision=res.revision
            )
        return found


def _record(
    owner: Owner | None, revision: int | None = None, *, handover_to: str | None = None
) -> OwnerRecord | None:
    """The admission's record of `owner`; `handover_to`: the handover's target from a
    mark read beside it (else what the owner record says)."""
    if owner is None:
        return None
    to = handover_to if handover_to is not None else owner.handing_over_to
    return OwnerRecord(
        owner.dataset,
        owner.region,
        owner.epoch,
        to is not None,
        to,
        revision,
        moved_by=owner.kind,
        moved_from=owner.from_region,
        epoch_before=owner.epoch_before,
    )
