"""The etcd v3 adapter of the coordination port, over `etcd3aio` (asyncio gRPC).

Guarantees are the port's (`controlplane.ports.coordination`). This module adds:
every call has a deadline (`timeout_s`, covering etcd3aio's own retries of
UNAVAILABLE / DEADLINE_EXCEEDED); gRPC and etcd3aio errors become Meridian errors
here and nowhere else; reads are linearizable (never `serializable`); a watch whose
start revision was compacted raises instead of skipping events, and a broken watch
stream is reopened after the last event it delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import grpc.aio
from etcd3aio import Etcd3Client, EtcdConnectionError, EtcdError, EtcdTransientError
from etcd3aio._protobuf import WatchCreateRequest, WatchRequest, WatchStub
from etcd3aio.kv import KVService, prefix_range_end

from controlplane.errors import (
    MeridianError,
    NotFoundError,
    OperationTimeoutError,
    UnavailableError,
    WatchCompactedError,
)
from controlplane.logs import get_logger
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    Op,
    Put,
    Target,
    TxnResult,
    WatchEvent,
)

log = get_logger(__name__)
T = TypeVar("T")

# etcdserverpb.Compare enums (CompareResult, CompareTarget).
_RESULT = {Cmp.EQUAL: 0, Cmp.GREATER: 1, Cmp.LESS: 2, Cmp.NOT_EQUAL: 3}
_TARGET = {Target.VERSION: 0, Target.CREATE: 1, Target.MOD: 2, Target.VALUE: 3}
_FIELD = {
    Target.VERSION: "version",
    Target.CREATE: "create_revision",
    Target.MOD: "mod_revision",
    Target.VALUE: "value",
}
_EVENT_DELETE = 1
# A watch stream broken with one of these is reopened after these waits (doubling up to
# the cap, with jitter); any other status ends the watch with an error. CANCELLED and
# INTERNAL are what some etcd releases answer when a member loses its leader or a
# stream is reset; a cancel of our own never reaches this loop.
_WATCH_TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL,
)
# etcd refuses (or later ends) the watch on a member without a leader.
_WATCH_METADATA = (("hasleader", "true"),)
_WATCH_BACKOFF_S = 0.1
_WATCH_BACKOFF_MAX_S = 0.5


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        version=int(raw.version),
        lease=int(raw.lease),
    )


class EtcdKeepAlive:
    """Renews one lease every third of its TTL; sets `lost` as the port describes."""

    def __init__(self, coord: EtcdCoordination, lease: Lease) -> None:
        self.lease = lease
        self._coord = coord
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = asyncio.create_task(
            self._run(), name=f"etcd-keepalive-{lease.id:x}"
        )

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    async def _run(self) -> None:
        # Renew at a third of the TTL (at least every second) so that two renewals
        # can fail before expiry; give up once a full TTL passed without success.
        interval = max(0.25, min(1.0, self.lease.ttl_s / 3))
        last_ok = time.monotonic()
        answered = True
        while True:
            # Count a renewal from when it was *sent*: etcd restarted the TTL no
            # earlier than that, so our idea of expiry is never later than etcd's.
            sent = time.monotonic()
            try:
                # Bounded by our idea of expiry: a call still unanswered then must not
                # keep us believing we hold the lease (a look and a renewal, each up to
                # the adapter's timeout, could otherwise run past it).
                async with asyncio.timeout(max(0.0, last_ok + self.lease.ttl_s - sent)):
                    if not answered:
                        # The last renewal went unanswered, yet it may have reached etcd
                        # (a one-way partition loses only the answers). Renewing blindly
                        # would keep the lease alive in etcd for as long as the answers
                        # are lost, while we count it lost after a TTL: look first (a
                        # read renews nothing), and renew once a look is answered. So
                        # etcd's expiry is at most an interval later than ours. etcd
                        # gives a live lease's TTL in whole seconds, rounded down (0:
                        # under a second left): only -1 says it is gone.
                        ttl = await self._coord.lease_ttl(self.lease.id)
                        sent = time.monotonic()
                        if ttl >= 0:
                            ttl = await self._coord.refresh(self.lease.id)
                    else:
                        ttl = await self._coord.refresh(self.lease.id)
            except (MeridianError, TimeoutError) as exc:
                why = str(exc) or "no answer before the lease's expiry as counted here"
                log.warning("lease_renewal_failed", lease=f"{self.lease.id:x}", error=why)
                ttl = None
            answered = ttl is not None
            now = time.monotonic()
            if ttl is not None and ttl <= 0:
                log.warning("lease_lost", lease=f"{self.lease.id:x}", why="expired in etcd")
                self._lost.set()
                return
            if ttl is not None:
                last_ok = sent
            elif now - last_ok >= self.lease.ttl_s:
                log.warning("lease_lost", lease=f"{self.lease.id:x}", why="no renewal for a TTL")
                self._lost.set()
                return
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        self._coord.forget(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class EtcdCoordination:
    """The coordination port on an etcd v3 cluster.

    `endpoints` are "host:port" strings; calls are balanced round-robin over them
    and retried by etcd3aio on transient codes within `timeout_s`.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise NotFoundError("no etcd endpoint was given; set MERIDIAN_ETCD or --etcd")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._client = Etcd3Client(
            self.endpoints,
            rpc_max_attempts=4,
        )
        self._connected = False
        self._keepalives: set[EtcdKeepAlive] = set()

    # -- lifecycle ---------------------------------------------------------------
    async def connect(self) -> None:
        """Open the channel and prove etcd answers (a linearizable read)."""
        if self._connected:
            return
        await self._client.connect()
        self._connected = True
        try:
            await self.revision()
        except MeridianError:
            await self.close()
            raise

    async def close(self) -> None:
        for ka in list(self._keepalives):
            await ka.stop()
        self._keepalives.clear()
        if self._connected:
            self._connected = False
            await self._client.close()

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

    # -- error edge --------------------------------------------------------------
    def _where(self) -> str:
        return ",".join(self.endpoints)

    async def _call(self, what: str, fn: Callable[[float], Awaitable[T]]) -> T:
        if not self._connected:
            raise UnavailableError(f"etcd at {self._where()} is not connected (call connect())")
        try:
            return await fn(self.timeout_s)
        except (TimeoutError, EtcdTransientError) as exc:
            raise OperationTimeoutError(
                f"etcd at {self._where()} did not answer {what} within {self.timeout_s:g} s"
            ) from exc
        except EtcdConnectionError as exc:
            raise UnavailableError(
                f"etcd at {self._where()} is unreachable ({what} failed); "
                "check that it runs and MERIDIAN_ETCD points at it"
            ) from exc
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFoundError(f"etcd {what}: {exc.details()}") from exc
            if exc.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (exc.details() or ""):
                # A read at a revision etcd compacted away: that past is gone for good,
                # which retrying cannot change (its other OUT_OF_RANGE answers stay errors).
                raise NotFoundError(f"etcd {what}: that revision was compacted") from exc
            raise UnavailableError(
                f"etcd at {self._where()} refused {what}: {exc.code().name} {exc.details()}"
            ) from exc
        except EtcdError as exc:
            raise UnavailableError(f"etcd at {self._where()} failed {what}: {exc}") from exc

    @property
    def _svc(self) -> Any:
        return self._client

    # -- kv ------------------------------------------------------------------
    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        what = f"get {key}" if not revision else f"get {key} at revision {revision}"
        resp = await self._call(what, lambda t: self._svc.kv.get(key, revision=revision, timeout=t))
        return _kv(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        end = prefix_range_end(prefix)
        resp = await self._call(
            f"get {prefix}*", lambda t: self._svc.kv.get(prefix, range_end=end, timeout=t)
        )
        kvs = sorted((_kv(k) for k in resp.kvs), key=lambda k: k.key)
        return kvs, int(resp.header.revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        resp = await self._call(
            f"put {key}", lambda t: self._svc.kv.put(key, value, lease=lease, timeout=t)
        )
        return int(resp.header.revision)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        end = prefix_range_end(key) if prefix else None
        resp = await self._call(
            f"delete {key}", lambda t: self._svc.kv.delete(key, range_end=end, timeout=t)
        )
        return int(resp.deleted)

    async def revision(self) -> int:
        resp = await self._call(
            "a revision read", lambda t: self._svc.kv.get("/meridian/", limit=1, timeout=t)
        )
        return int(resp.header.revision)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        from etcd3aio._protobuf import Compare as PbCompare

        pb_compares = []
        for c in compares:
            operand = c.operand
            pb = PbCompare(result=_RESULT[c.cmp], target=_TARGET[c.target], key=c.key.encode())
            setattr(pb, _FIELD[c.target], operand)
            pb_compares.append(pb)
        ok_ops = [self._op(o) for o in success]
        ko_ops = [self._op(o) for o in failure]
        # etcd answers a transaction of no operation at all as a serializable read, from
        # the member asked, which may lag (one restarted and still catching up): its
        # compares could judge stale values. One linearizable read in each branch has it
        # go through the leader's read index like any other read; its answer is dropped.
        probe = not success and not failure
        if probe:
            ok_ops = ko_ops = [KVService.txn_op_get(compares[0].key if compares else "\0")]
        keys = ",".join(sorted({c.key for c in compares})) or "keys"
        resp = await self._call(
            f"a transaction on {keys}",
            lambda t: self._svc.kv.txn(pb_compares, ok_ops, ko_ops, timeout=t),
        )
        branch = success if resp.succeeded else failure
        reads = [
            [_kv(k) for k in r.response_range.kvs]
            for op, r in zip(branch, resp.responses, strict=not probe)
            if isinstance(op, Get)
        ]
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), reads)

    @staticmethod
    def _op(op: Op) -> Any:
        if isinstance(op, Put):
            return KVService.txn_op_put(op.key, op.value, lease=op.lease)
        if isinstance(op, Delete):
            end = prefix_range_end(op.key) if op.prefix else None
            return KVService.txn_op_delete(op.key, range_end=end)
        end = prefix_range_end(op.key) if op.prefix else None
        return KVService.txn_op_get(op.key, range_end=end)

    # -- leases --------------------------------------------------------------
    async def grant(self, ttl_s: int) -> Lease:
        resp = await self._call(
            f"a {ttl_s} s lease grant", lambda t: self._svc.lease.grant(ttl_s, timeout=t)
        )
        return Lease(int(resp.ID), int(resp.TTL))

    async def revoke(self, lease_id: int) -> None:
        with contextlib.suppress(NotFoundError):
            await self._call(
                f"revoke of lease {lease_id:x}",
                lambda t: self._svc.lease.revoke(lease_id, timeout=t),
            )

    async def lease_ttl(self, lease_id: int) -> int:
        resp = await self._call(
            f"TTL of lease {lease_id:x}",
            lambda t: self._svc.lease.time_to_live(lease_id, timeout=t),
        )
        return int(resp.TTL)

    async def refresh(self, lease_id: int) -> int:
        async def once(deadline_s: float) -> int:
            stream = self._svc.lease.keep_alive(lease_id)
            try:
                async with asyncio.timeout(deadline_s):
                    async for resp in stream:
                        # etcd answers TTL 0 for a lease it no longer has; the port says -1.
                        return int(resp.TTL) if resp.TTL > 0 else -1
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    raise EtcdConnectionError(str(exc.details())) from exc
                raise
            finally:
                stream.cancel()
            return -1

        return await self._call(f"renewal of lease {lease_id:x}", once)

    def forget(self, keepalive: EtcdKeepAlive) -> None:
        """Drop a stopped keepalive from those `close()` stops."""
        self._keepalives.discard(keepalive)

    def keep_alive(self, lease: Lease) -> EtcdKeepAlive:
        ka = EtcdKeepAlive(self, lease)
        self._keepalives.add(ka)
        return ka

    # -- watch ---------------------------------------------------------------
    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        """Every change after `start_revision`, once each, across broken streams.

        etcd3aio's own watch resumes a broken stream from the last response header's
        revision + 1. A watch still catching up on history gets headers carrying the
        store's current revision, not its last event's, so a stream cut mid catch-up
        skipped every event in between. This runs the stream itself and resumes from
        the last event it delivered (etcd never splits one revision's events across
        responses, so that revision was delivered whole). The stream asks for a member
        with a leader: one cut off from its peers ends it (UNAVAILABLE) instead of
        keeping it open and silent while the cluster moves on.
        """
        self._check_connected()
        end = prefix_range_end(key) if prefix else b""
        # The first revision not yet delivered; "from now" is pinned by a read, so a
        # stream broken before etcd confirmed it loses nothing either.
        resume = start_revision if start_revision > 0 else await self.revision() + 1
        backoff_s = _WATCH_BACKOFF_S
        while True:
            self._check_connected()
            stub = WatchStub(self._client._channel)
            stop = asyncio.get_running_loop().create_future()
            stream = stub.Watch(
                _watch_requests(key.encode(), end, resume, stop), metadata=_WATCH_METADATA
            )
            try:
                async for resp in stream:
                    if resp.compact_revision > 0:
                        raise WatchCompactedError(
                            f"the watch on {key} asked for revision {resume}, but etcd "
                            f"compacted history up to {resp.compact_revision}; re-read and "
                            "re-watch"
                        )
                    if resp.canceled:
                        raise UnavailableError(
                            f"etcd cancelled the watch on {key}: "
                            f"{resp.cancel_reason or 'no reason given'}"
                        )
                    for ev in resp.events:
                        kind = EventType.DELETE if ev.type == _EVENT_DELETE else EventType.PUT
                        rev = int(ev.kv.mod_revision)
                        yield WatchEvent(kind, _kv(ev.kv), rev)
                        resume = rev + 1
                        # Only a stream that delivers resets the wait: one a link accepts
                        # and cuts at once is reopened ever more slowly.
                        backoff_s = _WATCH_BACKOFF_S
                why = "closed without a status"
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _WATCH_TRANSIENT:
                    raise UnavailableError(
                        f"the etcd watch on {key} failed: {exc.code().name} {exc.details()}"
                    ) from exc
                why = f"{exc.code().name} {exc.details()}"
            except asyncio.CancelledError:
                # grpc cancels the consumer of a stream whose channel `close()` shut.
                task = asyncio.current_task()
                if self._connected or (task is not None and task.cancelling()):
                    raise
                raise UnavailableError(
                    f"the etcd watch on {key} ended: the connection to etcd was closed"
                ) from None
            finally:
                # A call that already ended ignores cancel(), so the request side is
                # ended by hand: its task would otherwise wait forever, one per reopen.
                if not stop.done():
                    stop.set_result(None)
                stream.cancel()
            wait_s = backoff_s * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret
            log.warning(
                "etcd_watch_broken", key=key, why=why, resume_revision=resume, retry_s=wait_s
            )
            await asyncio.sleep(wait_s)
            backoff_s = min(backoff_s * 2, _WATCH_BACKOFF_MAX_S)

    def _check_connected(self) -> None:
        if not self._connected:
            raise UnavailableError(f"etcd at {self._where()} is not connected (call connect())")


async def _watch_requests(
    key: bytes, end: bytes, start: int, stop: asyncio.Future[None]
) -> AsyncIterator[Any]:
    """One create request; then the request side stays open until `stop` is set."""
    yield WatchRequest(
        create_request=WatchCreateRequest(key=key, range_end=end, start_revision=start)
    )
    await stop


async def connect_etcd(
    endpoints: Sequence[tuple[str, int]] | Sequence[str], timeout_s: float
) -> EtcdCoordination:
    """Connect to etcd and prove it answers, or raise one clear UnavailableError."""
    eps = [e if isinstance(e, str) else f"{e[0]}:{e[1]}" for e in endpoints]
    coord = EtcdCoordination(eps, timeout_s=timeout_s)
    await coord.connect()
    return coord
