"""Global locks: a lease-backed etcd mutex that hands out fencing tokens.

Why a lock alone is unsafe, and what the token is for
-----------------------------------------------------
A lock holder can be paused (GC, SIGSTOP, a VM migration, a slow disk) for longer
than its lease. etcd then expires the lease, grants the lock to the next waiter,
and the first holder wakes up still *believing* it holds the lock: two writers
act at once and nothing in the lock can stop them, because the paused holder has
no chance to check anything before its next write. The fix is on the resource
side: each grant carries a **fencing token** that only grows (here the etcd
`create_revision` of the holder's key), every write presents it, and the
resource refuses a token older than the newest it has seen
(`fencing.FencedResource`). A lock without fencing only makes a conflict
unlikely; a fenced lock makes a stale write impossible.

Protocol (etcd's linearizable mutex): grant a lease, create
`/meridian/locks/<name>/<lease-hex>` under it, and wait until that key has the
lowest `create_revision` under the prefix (watching only its predecessor, so a
release wakes one waiter, and reading the keys again every `recheck_s` of watching,
a TTL by default: a stream wedged without an error must not keep a standby waiting
for ever). After acquiring, the lease is **re-checked** with a
`TimeToLive` call and the key re-read: etcd issue 11456 showed a lock granted on a
lease that had already expired while the waiter was blocked.

While held, a monitor watches the keepalive and the holder's key; when the lease
is lost or the key deleted (revoked by an operator), `HeldLock.lost` is set and
the task inside `async with` is cancelled; it sees `LockLostError`.

Resuming after an etcd outage
-----------------------------
A keepalive gives up after a TTL without an answer, but etcd itself expires
nothing while it has no quorum, and its next leader gives every lease a fresh TTL.
So after an outage the lease may well be alive: revoking it on the way out (it
cannot be revoked while etcd is out anyway) or granting a new one would make the
holder's keys vanish and come back under a new lease, which others read as its
death. Instead, a hold that ended with its keepalive lost, or on a failed etcd
call, leaves the lease alone, and the next `hold()` on the same `GlobalLock` (one
holder at a time per instance) first asks etcd about it, then renews it: if etcd
still has it, the hold goes on under it (same key, same token: the lease never
lapsed, so nobody else can have held the lock meanwhile; unless an operator deleted
the key, which the hold then makes anew, with a new token, and does not count as a
resume); otherwise it grants a new one as usual. A holder that stops for good calls
`abandon()` to revoke a lease so kept.

Taken up by a holder that had been granted it while another waits, though, the kept
key goes to the back of the line (made anew under the same lease, so with a new token;
see `_gave_way`): a holder that loses its hold by its own count again and again (a
process that stalls for about a TTL) must not keep a healthy waiter out for good. Its
lease, and what else lives under it, stays. So after an outage a lock with a waiter
changes hands, and if that waiter died meanwhile (etcd's new leader gave its lease a
fresh TTL too) nobody holds the lock until its lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from controlplane.coordination.protocols import keys
from controlplane.errors import (
    FencedError,
    MeridianError,
    OperationTimeoutError,
    UnavailableError,
    WatchCompactedError,
)
from controlplane.logs import get_logger
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Coordination,
    EventType,
    KeepAlive,
    Lease,
    Put,
    Target,
)

log = get_logger(__name__)
WATCH_RETRY_FIRST_S = 0.1
WATCH_RETRY_MAX_S = 2.0


class LockLostError(FencedError):
    """The lease behind a held lock expired or was revoked; the holder must stop."""


@dataclass
class HeldLock:
    """A granted lock: present `token` with every write it protects."""

    name: str
    key: str
    token: int
    lease: Lease
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    resumed: bool = False  # the last hold goes on: its kept lease and its key, so its token


class GlobalLock:
    """A named mutex over the coordination port (see the module docstring)."""

    def __init__(
        self,
        coord: Coordination,
        name: str,
        *,
        ttl_s: int = 5,
        prefix: str | None = None,
        recheck_s: float | None = None,
    ) -> None:
        self.coord = coord
        self.name = name
        self.ttl_s = ttl_s
        # How long a waiter trusts a watch of the key ahead before it reads the
        # keys again (`_watched`): one read a TTL, the delay a failover allows.
        self.recheck_s = float(ttl_s) if recheck_s is None else recheck_s
        self.prefix = prefix if prefix is not None else keys.lock(name)
        # The lease of a hold that ended with its keepalive lost or an etcd call failed
        # (etcd may still have it: the next hold renews it), else None.
        self._resumable: Lease | None = None
        # Whether that hold had been granted (its key first in line), not still waiting.
        self._kept_granted = False

    async def _lease(self) -> tuple[Lease, bool]:
        """The lease to hold under, and whether it is the last hold's (still alive).

        The kept lease is renewed, not just looked at, so that etcd's expiry is a whole
        TTL away as the keepalive starts counting; until etcd answered (an error, a
        cancel) it stays kept for the next try. It is looked at first: a renewal whose
        answer is lost (a one-way partition) still reaches etcd and restarts its TTL, so
        renewing on every try would keep alive, for as long as the answers are lost, the
        lease of a holder that has stepped down, and with it its keys (a region's
        liveness key, which other regions wait to see gone before they fail it over). A
        look renews nothing: only once one is answered is the lease renewed."""
        old = self._resumable
        if old is not None:
            ttl = await self.coord.lease_ttl(old.id)
            if ttl >= 0:  # whole seconds, rounded down: 0 is a live lease (see refresh)
                ttl = await self.coord.refresh(old.id)
            self._resumable = None
            if ttl > 0:
                return old, True
        return await self.coord.grant(self.ttl_s), False

    async def abandon(self) -> None:
        """Revoke the lease kept for the next hold, if any (the holder stops for good, so
        a standby need not wait for it to expire). Best effort: etcd may be out."""
        lease, self._resumable = self._resumable, None
        self._kept_granted = False
        if lease is not None:
            with contextlib.suppress(Exception):
                await self.coord.revoke(lease.id)

    async def _gave_way(self, my_key: str, value: bytes, lease: Lease) -> bool:
        """A granted holder taking its kept key up again moves it behind whoever waits (deleted,
        then made anew under the same lease: a new token); True when it did.

        Its last hold was lost by its own count (renewals unanswered for a TTL, or an
        etcd call failed) while etcd kept the lease, so its key stayed first in line.
        Resumed at every such loss, a holder that stalls for about a TTL again and again
        would keep a healthy waiter (a region's standby controller) out for good. The
        lease is kept, so what else it holds (the region's liveness key) does not vanish
        meanwhile: the waiter, once granted, overwrites that key under its own lease."""
        kvs, _ = await self.coord.get_prefix(self.prefix)
        if not any(kv.key != my_key for kv in kvs):
            return False
        await self.coord.delete(my_key)  # named by our lease: nobody else writes it
        await self.coord.txn(
            [Compare(my_key, Target.CREATE, Cmp.EQUAL, 0)], [Put(my_key, value, lease.id)]
        )
        log.info("lock_gave_way", lock=self.name, lease=f"{lease.id:x}", waiting=len(kvs) - 1)
        return True

    async def _wait_first(self, my_key: str) -> int:
        """Block until `my_key` is the oldest under the prefix; returns its create revision.

        An etcd call that fails ends the wait (UnavailableError): `hold` keeps the
        lease, so the next hold renews it and finds its key still in line, where a wait
        through the outage would leave the lease unrenewed once the keepalive gave up."""
        delay = WATCH_RETRY_FIRST_S
        while True:
            kvs, rev = await self.coord.get_prefix(self.prefix)
            kvs.sort(key=lambda kv: kv.create_revision)
            mine = next((i for i, kv in enumerate(kvs) if kv.key == my_key), None)
            if mine is None:
                raise LockLostError(
                    f"lock {self.name}: our key vanished while waiting (the lease expired)"
                )
            if mine == 0:
                return kvs[0].create_revision
            pred = kvs[mine - 1].key
            if await self._watched(pred, rev + 1) == "ended":
                # Closed before its time, without an error: no hot loop of reads.
                await asyncio.sleep(delay)
                delay = min(delay * 2, WATCH_RETRY_MAX_S)
            else:
                delay = WATCH_RETRY_FIRST_S

    async def _watched(self, key: str, start: int) -> Literal["deleted", "elapsed", "ended"]:
        """What a watch of `key` from `start` saw: its deletion; no deletion within
        `recheck_s` (the watch is then given up, whatever it said meanwhile); or its own
        end first (a stream closed without an error). The caller reads the keys again
        after either of the last two: a stream wedged without an error (which no
        keepalive of the lease notices) still costs at most `recheck_s`."""
        # A watch from a compacted revision is given up too: the caller's read is newer.
        with contextlib.suppress(TimeoutError, WatchCompactedError):
            # The timeout cancels the watch inside its own step, so its stream is closed.
            async with asyncio.timeout(self.recheck_s):
                async for ev in self.coord.watch(key, start_revision=start):
                    if ev.type is EventType.DELETE:
                        return "deleted"
                return "ended"
        return "elapsed"

    @contextlib.asynccontextmanager
    async def hold(
        self, *, timeout_s: float | None = None, value: bytes = b""
    ) -> AsyncIterator[HeldLock]:
        """Acquire (waiting at most `timeout_s`), yield the grant, release on exit (or,
        when the keepalive was lost or an etcd call failed, leave the lease for the next
        hold to take up)."""
        was_granted = self._kept_granted
        lease, resumed = await self._lease()
        ka: KeepAlive = self.coord.keep_alive(lease)
        my_key = f"{self.prefix}{lease.id:016x}"
        monitor: asyncio.Task[None] | None = None
        keep = False  # leave the lease to the next hold rather than revoke it
        waited_out = False  # gave up waiting for another holder: a hold given up for good
        try:
            created = await self.coord.txn(
                [Compare(my_key, Target.CREATE, Cmp.EQUAL, 0)], [Put(my_key, value, lease.id)]
            )
            # A kept lease whose key is gone (an operator deleted it) is a new hold under
            # an old lease: a new token, and another holder may have held it meanwhile.
            resumed = resumed and not created.succeeded
            if resumed and was_granted and await self._gave_way(my_key, value, lease):
                resumed = False
            try:
                async with asyncio.timeout(timeout_s):
                    token = await self._wait_first(my_key)
            except TimeoutError as exc:
                waited_out = True
                raise OperationTimeoutError(
                    f"lock {self.name} not granted within {timeout_s:g} s: another holder has it"
                ) from exc
            # etcd issue 11456: the grant may have come on a lease that expired meanwhile.
            if await self.coord.lease_ttl(lease.id) <= 0 or ka.lost.is_set():
                raise LockLostError(f"lock {self.name} was granted on an expired lease")
            held = HeldLock(self.name, my_key, token, lease, resumed=resumed)
            holder = asyncio.current_task()
            if holder is None:
                raise RuntimeError("GlobalLock.hold must run inside a task")
            monitor = asyncio.create_task(self._monitor(held, ka, holder), name=f"lock-{self.name}")
            try:
                yield held
            except asyncio.CancelledError:
                if held.lost.is_set() and holder.uncancel() == 0:
                    raise LockLostError(
                        f"lock {self.name} (token {token}) lost: its lease expired or was revoked"
                    ) from None
                raise
        except UnavailableError:
            # An etcd call failed (not the wait for another holder, which gives up for
            # good): whether etcd still has the lease is asked by the next hold.
            keep = not waited_out
            raise
        finally:
            if monitor is not None:
                monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
            await ka.stop()
            if ka.lost.is_set() or keep:
                # Gone in etcd, or unanswered for a TTL, or an etcd call failed (an
                # outage etcd may outlive without expiring it): the next hold renews
                # it if etcd still has it.
                self._resumable = lease
                # Granted, or a granted key taken up but neither moved back nor made anew
                # yet (an etcd call failed first): the next hold gives way. A waiter
                # keeps its place.
                self._kept_granted = monitor is not None or (was_granted and resumed)
            else:
                self._kept_granted = False
                with contextlib.suppress(Exception):
                    await self.coord.revoke(lease.id)

    async def _monitor(self, held: HeldLock, ka: KeepAlive, holder: asyncio.Task[object]) -> None:
        async def key_deleted() -> None:
            # Only a deletion of our key, or finding it gone, means the lock is lost. A
            # watch that breaks (compacted history, a non-transient gRPC error) says
            # nothing about the lock: look at the key, then watch again from there,
            # while the keepalive (watched beside this) decides about the lease.
            # Every `recheck_s` of watching, the key is looked at the same way (one read a
            # TTL): an operator's delete is noticed even through a wedged stream.
            start, delay = held.token + 1, WATCH_RETRY_FIRST_S
            while True:
                try:
                    seen = await self._watched(held.key, start)
                except MeridianError as exc:
                    log.warning("lock_watch_broken", lock=self.name, error=str(exc))
                    seen = "ended"
                if seen == "deleted":
                    return
                if seen == "ended":
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, WATCH_RETRY_MAX_S)
                else:
                    delay = WATCH_RETRY_FIRST_S
                try:
                    kvs, revision = await self.coord.get_prefix(held.key)
                except MeridianError as exc:
                    log.warning("lock_watch_broken", lock=self.name, error=str(exc))
                    continue
                if not any(kv.key == held.key and kv.lease == held.lease.id for kv in kvs):
                    return
                start = revision + 1

        waiters = [asyncio.create_task(ka.lost.wait()), asyncio.create_task(key_deleted())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            for w in waiters:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await w
        log.warning("lock_lost", lock=self.name, token=held.token)
        held.lost.set()
        holder.cancel(f"lock {self.name} lost")
