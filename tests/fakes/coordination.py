"""An in-memory `Coordination` (controlplane.ports.coordination) for unit tests.

It keeps the port's contract as the etcd adapter does, so code unit-tested on it
behaves the same on etcd (tests/coordination/test_coordination_contract.py runs the
same assertions against both):

* one store-wide revision, starting at 1, bumped once per write request that
  changes something (a transaction with several writes bumps it once; deleting
  nothing, or a transaction that only reads, does not);
* `create_revision`, `mod_revision` and `version` per key, 0 for a missing key in
  compares; a VALUE compare on a missing key is false whatever the operator;
* transactions apply one branch in order, its reads seeing its own writes;
* leases expire `ttl_s` after their last renewal (on the event loop's clock, or
  on a `ManualClock` a test advances), deleting their keys at one revision;
  `lease_ttl` and `refresh` answer -1 for a lease that is gone, and `lease_ttl` a
  live one's in whole seconds rounded down, as etcd does;
* watches deliver every event from `start_revision` (inclusive; 0 means from
  now) in revision order, several events of one revision in the order of their
  operations; a start revision below `compact()`'s raises, and so does a watch
  that lags behind a compaction.

Beyond the port: `set_unavailable(True)` makes every call fail with the
retriable `UnavailableError` until it is set back, while open watches go quiet and
then catch up, as the adapter's do across an etcd outage; `break_watches(error)`
ends every open watch with `error`; `extend_leases` renews every lease as etcd's next
leader does after one; `refused` counts the calls it failed, so a
test can await the code under test meeting the outage; `compact(revision)` forgets
history like etcd's compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from controlplane.errors import (
    MeridianError,
    NotFoundError,
    UnavailableError,
    WatchCompactedError,
)
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Delete,
    EventType,
    KeyValue,
    Lease,
    Op,
    Put,
    Target,
    TxnResult,
    WatchEvent,
)


@dataclass(frozen=True, eq=False)
class _Break:
    """One `break_watches` call: the watches opened before it end with its error."""

    error: Exception | None


class ManualClock:
    """A monotonic clock that only moves when a test calls `advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._listeners: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for listener in list(self._listeners):
            listener()


@dataclass
class _Lease:
    id: int
    ttl_s: int
    expires_at: float
    keys: set[str] = field(default_factory=set)


class MemoryKeepAlive:
    """Renews a lease every third of its TTL; `lost` as the port describes."""

    def __init__(self, coord: MemoryCoordination, lease: Lease) -> None:
        self.lease = lease
        self._coord = coord
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = asyncio.create_task(self._run())

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    async def _run(self) -> None:
        interval = max(0.25, min(1.0, self.lease.ttl_s / 3))
        last_ok = self._coord.clock()
        while True:
            sent = self._coord.clock()
            try:
                ttl: int | None = await self._coord.refresh(self.lease.id)
            except MeridianError:
                ttl = None
            if ttl is not None and ttl <= 0:
                self._lost.set()
                return
            if ttl is not None:
                last_ok = sent
            elif self._coord.clock() - last_ok >= self.lease.ttl_s:
                self._lost.set()
                return
            await self._coord.pause(interval)

    async def stop(self) -> None:
        self._coord.keepalives.discard(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class MemoryCoordination:
    """The coordination port in memory, for one event loop (see the module docstring).

    `clock` is the monotonic clock leases expire on: by default the running loop's
    (so leases expire in real time and keepalives renew them), or a `ManualClock`,
    on which leases expire only when the test advances it (keepalives then renew
    when the clock has moved by a third of the TTL).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._manual = isinstance(clock, ManualClock)
        if isinstance(clock, ManualClock):
            clock._listeners.append(self._expire)
        self._revision = 1
        self._data: dict[str, KeyValue] = {}
        self._history: list[WatchEvent] = []
        self._compacted = 0
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x694D_0000_0001)
        self._changed = asyncio.Event()
        self._unavailable = False
        self._broken = _Break(None)
        self.refused = 0  # calls failed by `set_unavailable`
        self._closed = False
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self.keepalives: set[MemoryKeepAlive] = set()

    # -- test controls ---------------------------------------------------------
    def set_unavailable(self, down: bool) -> None:
        """Make every call fail as if the store could not be reached (or stop that). Open
        watches go quiet meanwhile and then deliver what they missed, as the adapter's
        watch does across a broken stream."""
        self._unavailable = down
        self._notify()  # down: watches go quiet; up: they deliver what they held back

    def break_watches(self, error: Exception) -> None:
        """End every open watch with `error`, as the adapter ends one on a status it does
        not retry (a cancel by etcd, a refused request)."""
        self._broken = _Break(error)
        self._notify()

    def extend_leases(self, seconds: float) -> None:
        """Give every lease a TTL and `seconds` from now, as etcd's next leader does after
        an outage (it expires nothing while it has no quorum)."""
        for lease in self._leases.values():
            lease.expires_at = self.clock() + lease.ttl_s + seconds
            self._schedule(lease)

    def compact(self, revision: int) -> None:
        """Forget the history before `revision`, like etcd's compaction (a watch may still
        start at `revision` itself, not before it)."""
        self._compacted = max(self._compacted, revision)
        self._history = [e for e in self._history if e.revision >= self._compacted]

    async def pause(self, seconds: float) -> None:
        """Wait `seconds` on this store's clock (real time, or until a test advances it)."""
        if not self._manual:
            await asyncio.sleep(seconds)
            return
        until = self.clock() + seconds
        while self.clock() < until:
            await self._wait_change()

    # -- internals --------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise UnavailableError("the in-memory coordination store is closed")
        if self._unavailable:
            self.refused += 1
            raise UnavailableError("the in-memory coordination store is unavailable (test fault)")
        self._expire()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _expire(self) -> None:
        now = self.clock()
        gone = [lease for lease in self._leases.values() if lease.expires_at <= now]
        for lease in gone:
            self._drop_lease(lease.id)
        if self._manual:
            self._notify()  # a paused keepalive re-checks the clock

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        timer = self._timers.pop(lease_id, None)
        if timer is not None:
            timer.cancel()
        if lease is None:
            return
        present = sorted(k for k in lease.keys if k in self._data)
        if present:
            self._commit([Delete(k) for k in present])

    def _schedule(self, lease: _Lease) -> None:
        if self._manual:
            return
        old = self._timers.pop(lease.id, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, lease.expires_at - self.clock()) + 0.001
        self._timers[lease.id] = loop.call_later(delay, self._expire)

    def _commit(self, ops: Sequence[Op]) -> tuple[int, list[list[KeyValue]]]:
        """Apply `ops` in order at one new revision (kept only if something changed)."""
        rev = self._revision + 1
        events: list[WatchEvent] = []
        reads: list[list[KeyValue]] = []
        for op in ops:
            if isinstance(op, Put):
                if op.lease and op.lease not in self._leases:
                    raise NotFoundError(f"put {op.key}: requested lease {op.lease:x} not found")
                old = self._data.get(op.key)
                if old is not None and old.lease and old.lease in self._leases:
                    self._leases[old.lease].keys.discard(op.key)
                kv = KeyValue(
                    op.key,
                    op.value,
                    old.create_revision if old is not None else rev,
                    rev,
                    old.version + 1 if old is not None else 1,
                    op.lease,
                )
                self._data[op.key] = kv
                if op.lease:
                    self._leases[op.lease].keys.add(op.key)
                events.append(WatchEvent(EventType.PUT, kv, rev))
            elif isinstance(op, Delete):
                for key in self._matching(op.key, op.prefix):
                    old = self._data.pop(key)
                    if old.lease in self._leases:
                        self._leases[old.lease].keys.discard(key)
                    events.append(WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, rev, 0), rev))
            else:
                reads.append([self._data[k] for k in self._matching(op.key, op.prefix)])
        if events:
            self._revision = rev
            self._history.extend(events)
            self._notify()
        return self._revision, reads

    def _matching(self, key: str, prefix: bool) -> list[str]:
        if prefix:
            return sorted(k for k in self._data if k.startswith(key))
        return [key] if key in self._data else []

    def _holds(self, c: Compare) -> bool:
        kv = self._data.get(c.key)
        if c.target is Target.VALUE:
            if kv is None or not isinstance(c.operand, bytes):
                return False
            actual: int | bytes = kv.value
        elif kv is None:
            actual = 0
        else:
            actual = {
                Target.MOD: kv.mod_revision,
                Target.CREATE: kv.create_revision,
                Target.VERSION: kv.version,
            }[c.target]
        want = c.operand
        if isinstance(actual, bytes) != isinstance(want, bytes):
            return False
        if c.cmp is Cmp.EQUAL:
            return actual == want
        if c.cmp is Cmp.NOT_EQUAL:
            return actual != want
        if c.cmp is Cmp.LESS:
            return actual < want  # type: ignore[operator]
        return actual > want  # type: ignore[operator]

    # -- the port ----------------------------------------------------------------
    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        self._check()
        if not revision or revision >= self._revision:
            return self._data.get(key)
        if revision < self._compacted:
            raise NotFoundError(f"get {key} at revision {revision}: compacted")
        past = [e for e in self._history if e.kv.key == key and e.revision <= revision]
        if not past:  # unchanged since before the history kept, or absent then
            now = self._data.get(key)
            return now if now is not None and now.mod_revision <= revision else None
        return None if past[-1].type is EventType.DELETE else past[-1].kv

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check()
        return [self._data[k] for k in self._matching(prefix, True)], self._revision

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._check()
        return self._commit([Put(key, value, lease)])[0]

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self._check()
        count = len(self._matching(key, prefix))
        self._commit([Delete(key, prefix)])
        return count

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check()
        ok = all(self._holds(c) for c in compares)
        revision, reads = self._commit(success if ok else failure)
        return TxnResult(ok, revision, reads)

    async def grant(self, ttl_s: int) -> Lease:
        self._check()
        lease = _Lease(next(self._lease_ids), ttl_s, self.clock() + ttl_s)
        self._leases[lease.id] = lease
        self._schedule(lease)
        return Lease(lease.id, ttl_s)

    async def revoke(self, lease_id: int) -> None:
        self._check()
        self._drop_lease(lease_id)

    async def lease_ttl(self, lease_id: int) -> int:
        self._check()
        lease = self._leases.get(lease_id)
        if lease is None:
            return -1
        # As etcd: whole seconds, rounded down (0: a live lease with under a second left).
        return max(0, math.floor(lease.expires_at - self.clock()))

    async def refresh(self, lease_id: int) -> int:
        self._check()
        lease = self._leases.get(lease_id)
        if lease is None:
            return -1
        lease.expires_at = self.clock() + lease.ttl_s
        self._schedule(lease)
        return lease.ttl_s

    def keep_alive(self, lease: Lease) -> MemoryKeepAlive:
        ka = MemoryKeepAlive(self, lease)
        self.keepalives.add(ka)
        return ka

    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        self._check()
        start = start_revision if start_revision > 0 else self._revision + 1
        if start < self._compacted:
            raise WatchCompactedError(
                f"the watch on {key} asked for revision {start}, but history was compacted "
                f"up to {self._compacted}; re-read and re-watch"
            )
        nxt = start
        broken = self._broken
        while True:
            if nxt < self._compacted:  # compacted while this watch lagged behind
                raise WatchCompactedError(
                    f"the watch on {key} was at revision {nxt}, but history was compacted "
                    f"up to {self._compacted}; re-read and re-watch"
                )
            # Events written while the consumer handles this batch come in the next one;
            # an outage holds them back (the adapter reopens the stream after it).
            upto = nxt - 1 if self._unavailable else self._revision
            for ev in [e for e in self._history if nxt <= e.revision <= upto]:
                if ev.kv.key == key or (prefix and ev.kv.key.startswith(key)):
                    yield ev
            nxt = upto + 1
            while self._revision < nxt or self._unavailable:
                if self._closed:
                    raise UnavailableError(f"the watch on {key} ended: the store was closed")
                if self._broken is not broken and self._broken.error is not None:
                    raise self._broken.error
                await self._wait_change()

    async def revision(self) -> int:
        self._check()
        return self._revision

    async def close(self) -> None:
        for ka in list(self.keepalives):
            await ka.stop()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if not self._closed:
            self._closed = True
            self._notify()

    async def connect(self) -> None:
        """Nothing to connect to; present so code written for the adapter runs unchanged."""
        self._check()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
