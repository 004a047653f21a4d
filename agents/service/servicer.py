"""`AgentService`: the agent API's calls on this agent's store (spec/dataplane.md).

It answers Put, Get, GetSet, Stat, List, Delete, CommitSet, Evict and Health itself and hands
Signature, Sync, Replicate and Fetch to a `Transfers` object (agents/transfer), and
ReplicateSet to a `SetReceiver` and ReplicatePushes to a `PushReceiver`
(agents/replication), answering UNIMPLEMENTED while there is none.

Writes (Put, Delete, CommitSet) are admitted first (`Admission.admit_write`:
residency, and for a critical dataset owner, epoch and handover), so a refused
write touches nothing; a Put is admitted again once its bytes have arrived, just
before its commit, so a handover that committed during a long upload refuses it.
A Put's bytes stream into the store's staged write, one thread hop per chunk
(hashing and disk writes never run on the event loop), and commit atomically; one
of at most `INLINE_BYTES` is held until its end and then checked and committed in
a single thread hop (three or more cost a small write more CPU than its commit),
its bytes kept inline in the store's database (`ObjectStore.put_small`, no file); a
standard write's change event is committed with it (the store's outbox), a
critical write's epoch is recorded with it. After the local commit a critical
write is handed to the `Replication` hook (synchronous replication, issue 13:
agents/replication/), which returns once the policy's `ack` copies hold it; the
response names the regions holding it. A small critical Put is handed on as soon as
its version has its HLC, its commit still under way (`CommittedWrite.local`), so
that its push overlaps its commit; the hook counts this region only once that
commit is done, and the Put is answered only then.

Every call is counted by call and code and ends with the code of its error
(agents.service.outcome).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Never, Protocol, TypedDict

import grpc

from agents.admission import Admission, Admitted
from agents.daemon.metrics_http import bind_store_gauges
from agents.metrics import AgentMetrics
from agents.service import requests
from agents.service.outcome import Context, stream, unary
from agents.service.small_puts import SmallPuts
from agents.store import (
    CHUNK_BYTES,
    DigestMismatchError,
    ObjectReader,
    ObjectStore,
    SetRecord,
    ShortStreamError,
    SmallPut,
    StagedWrite,
    StoredVersion,
    TooLargeError,
)
from agents.store.room import check_room
from agents.store.store import INLINE_MAX_BYTES
from agents.to_the_end import open_in_thread, run_to_the_end
from controlplane.domain.eviction import OwnerSeen, eviction_refused, placement_digest
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import (
    InvalidInputError,
    NotFoundError,
    OperationTimeoutError,
    RefusedError,
    UnavailableError,
)
from controlplane.logs import get_logger
from meridian.convert import (
    hlc_from_wire,
    version_set_from_wire,
    version_set_to_wire,
    version_to_wire,
)
from meridian.v1 import agent_pb2, agent_pb2_grpc

log = get_logger("meridian.agent.api")

# A Put of at most this many bytes is held in memory until its end and then stored in
# one thread hop (and its bytes pushed from memory, for a critical dataset).
INLINE_BYTES = INLINE_MAX_BYTES  # what the store keeps inline (`put_small`)
# Keys one Evict call may name: a call of that many commits one transaction per object,
# a few seconds on a loaded disk, well inside a client's deadline.
MAX_EVICT_KEYS = 1000


class Transfers(Protocol):
    """The agent's transfer calls (agents/transfer), with the generated servicer's
    signatures."""

    def Signature(  # noqa: N802 - the generated names
        self, request: agent_pb2.SignatureRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SignatureResponse]: ...

    def Sync(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.SyncRequest], context: Context
    ) -> AsyncIterator[agent_pb2.SyncResponse]: ...

    async def Replicate(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.ReplicateRequest], context: Context
    ) -> agent_pb2.ReplicateResponse: ...

    async def Fetch(  # noqa: N802
        self, request: agent_pb2.FetchRequest, context: Context
    ) -> agent_pb2.FetchResponse: ...

    def SyncBundle(  # noqa: N802
        self, request: agent_pb2.SyncBundleRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SyncBundleResponse]: ...

    async def FetchMany(  # noqa: N802
        self, request: agent_pb2.FetchManyRequest, context: Context
    ) -> agent_pb2.FetchManyResponse: ...

    async def ReplicateMany(  # noqa: N802
        self, request: agent_pb2.ReplicateManyRequest, context: Context
    ) -> agent_pb2.ReplicateManyResponse: ...

    async def Rewind(  # noqa: N802
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse: ...

    def drop_evicted(self, dataset: str, evicted: Mapping[str, str]) -> int:
        """Forget the partial pulls of what an eviction forgot (ResumeBook.drop_evicted)."""
        ...


@dataclass(frozen=True, slots=True)
class CommittedWrite:
    """A critical write committed here, for the replication hook: a version (`key` and
    `version`) or a set (`set_record`)."""

    admitted: Admitted
    dataset: str
    key: str | None = None
    version: Version | None = None
    set_id: str | None = None
    set_record: SetRecord | None = None
    # The bytes of a small version, as the client sent them: pushed from here, not read
    # back from the store (None: read them there).
    data: bytes | None = None
    # The owner's own commit of `version`, when it was handed on still under way
    # (pushed while it commits): its copy counts toward the ack only once this is done,
    # and its error is the write's. None: committed before it was handed on.
    local: asyncio.Future[Version] | None = None


class Replication(Protocol):
    """Synchronous replication of critical writes (issue 13): pushes the committed write
    to the replica regions and returns once the policy's `ack` copies are committed,
    raising (the client's call fails with that error) when they cannot be. Returns the
    regions that hold the write (this one first)."""

    async def replicate(self, write: CommittedWrite) -> tuple[str, ...]: ...


class SetReceiver(Protocol):
    """A replica's side of ReplicateSet (issue 13: agents/replication/replica_sets.py):
    version sets of a critical dataset pushed by its owner, fenced like Replicate."""

    async def receive_sets(
        self, request: agent_pb2.ReplicateSetRequest
    ) -> agent_pb2.ReplicateSetResponse: ...


class PushReceiver(Protocol):
    """A replica's side of ReplicatePushes (issue 13: agents/replication/replica_pushes.py):
    several small critical versions pushed by their owner in one call. `serves()`: this
    agent takes a batch now (an agent of a region of several does not: each key is
    routed, so it answers UNIMPLEMENTED and the owner pushes alone)."""

    def serves(self) -> bool: ...

    async def receive(
        self, request: agent_pb2.ReplicatePushesRequest
    ) -> agent_pb2.ReplicatePushesResponse: ...


class ReadThrough(Protocol):
    """The read-through cache (issue 16, agents/cache/): Get and Stat of a dataset this
    region holds no replica of, which this agent's store cannot answer."""

    def serves(self, dataset: str) -> bool: ...

    async def open(self, dataset: str, key: str, hlc: HLC | None) -> ObjectReader: ...

    async def stat(self, dataset: str, key: str, hlc: HLC | None) -> agent_pb2.ObjectInfo: ...


class AgentService(agent_pb2_grpc.AgentServicer):
    """The `meridian.v1.Agent` servicer of one agent (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        admission: Admission,
        region: str,
        agent_id: str,
        metrics: AgentMetrics,
        transfers: Transfers | None = None,
        *,
        replication: Replication | None = None,
        max_object_bytes: int | None = None,
        sets: SetReceiver | None = None,
        cache: ReadThrough | None = None,
    ) -> None:
        self.store = store
        self.small_puts = SmallPuts(store)
        self.admission = admission
        self.region = region
        self.agent_id = agent_id
        self.metrics = metrics
        self.transfers = transfers
        self.replication = replication
        self.max_object_bytes = max_object_bytes
        self.sets = sets
        # Awaited before a set member or a set is stored here (the daemon lowers its
        # roster entry to 1 copy, agents/placement/roster.py: a set stays on the agent
        # that takes it, so this agent then holds the region's only copy of it).
        self.holding_sets: Callable[[], Awaitable[None]] | None = None
        self.cache = cache
        # The store gauges read the store's usage row when scraped, not after every write
        # (a thread hop, a query and a statvfs per write, for gauges read far less often).
        bind_store_gauges(metrics, store.usage)
        # Set by the daemon after construction (agents/daemon/agent.py).
        self.pushes: PushReceiver | None = None

    # -- writes ------------------------------------------------------------------------

    async def Put(  # noqa: N802 - the generated name
        self, request_iterator: AsyncIterator[agent_pb2.PutRequest], context: Context
    ) -> agent_pb2.PutResponse:
        return await unary(
            "Put", context, self.metrics, lambda: self._put(request_iterator, context)
        )

    async def PutSmall(  # noqa: N802 - the generated name
        self, request: agent_pb2.PutSmallRequest, context: Context
    ) -> agent_pb2.PutResponse:
        return await unary(
            "PutSmall", context, self.metrics, lambda: self._put_small(request, context)
        )

    async def _put_small(
        self, request: agent_pb2.PutSmallRequest, context: Context
    ) -> agent_pb2.PutResponse:
        """A whole small object in one message: what `_put` does with a Put that ends
        within its first INLINE_BYTES, without a stream to read (a streamed Put of 1 KiB
        costs both ends about twice the CPU of a unary call)."""
        header = check_small(request, self.max_object_bytes)
        admitted = await self.admission.admit_write(header.dataset, header.epoch)
        if header.set_id is not None and self.holding_sets is not None:
            await self.holding_sets()
        return await self._commit_write(
            context, header, admitted, None, request.data, None, call="PutSmall"
        )

    async def _put(
        self, frames: AsyncIterator[agent_pb2.PutRequest], context: Context
    ) -> agent_pb2.PutResponse:
        first = await anext(frames, None)
        if first is None or first.WhichOneof("frame") != "header":
            raise InvalidInputError("PutRequest.header: a Put's first message must be its header")
        header = _Header.of(first.header, self.max_object_bytes)
        dataset, key, size = header.dataset, header.key, header.size
        if size is not None and size > INLINE_BYTES:
            await asyncio.to_thread(
                check_room, self.store.root, f"PutHeader.size: {dataset}/{key}", size
            )
        admitted = await self.admission.admit_write(dataset, header.epoch)
        if header.set_id is not None and self.holding_sets is not None:
            await self.holding_sets()
        # The first INLINE_BYTES are held here, not staged: an object that ends within
        # them (the common small write) is stored in ONE thread hop, after its end.
        # A larger one is staged then and streams on, one thread hop per chunk.
        held: list[bytes] = []
        held_bytes = 0
        staged: StagedWrite | None = None
        try:
            end: agent_pb2.PutEnd | None = None
            async for frame in frames:
                kind = frame.WhichOneof("frame")
                if end is not None:
                    raise InvalidInputError("PutRequest: nothing may follow a Put's end")
                if kind == "end":
                    end = frame.end
                    continue
                if kind != "chunk":
                    raise InvalidInputError(
                        "PutRequest.chunk: every message after a Put's header must be a chunk"
                    )
                chunk = frame.chunk
                if len(chunk) > CHUNK_BYTES:
                    raise TooLargeError(
                        f"PutRequest.chunk: a chunk holds at most {CHUNK_BYTES} bytes, got "
                        f"{len(chunk)}; nothing was stored"
                    )
                if staged is None and held_bytes + len(chunk) <= INLINE_BYTES:
                    held.append(chunk)
                    held_bytes += len(chunk)
                    continue
                if staged is None:
                    # Cancelled meanwhile, the file the thread staged is dropped too.
                    staged = await run_to_the_end(
                        functools.partial(self._stage, dataset, key, size, header.digest, held),
                        release=StagedWrite.abort,
                    )
                    held = []
                await asyncio.to_thread(staged.write, chunk)
            _before_commit(context, "Put")  # a stream cut by its deadline ends like this too
            got = held_bytes if staged is None else staged.size
            if end is None and (size is None or got != size):
                # grpc ends the request stream this way when the writer was killed, its
                # connection cut, or a message refused as too large: not a whole object.
                raise ShortStreamError(
                    f"PutRequest.end: the stream of {dataset}/{key} ended after {got} "
                    "bytes without its end (the writer went away, its connection was cut, or "
                    "a message was too large); nothing was stored"
                )
            stated = None
            if end is not None and end.HasField("digest"):
                stated = requests.digest("PutEnd.digest", True, end.digest)
            if staged is not None and stated is not None:
                await asyncio.to_thread(_check_digest, staged, stated)
            # Admitted again at the end of the stream, which may have taken minutes: a
            # handover or a narrowed residency meanwhile refuses it, nothing stored.
            admitted = await self.admission.admit_write(
                dataset, admitted.epoch if admitted.critical else None
            )
            whole = b"".join(held) if staged is None else b""
            return await self._commit_write(
                context, header, admitted, staged, whole, stated, call="Put"
            )
        finally:
            # After a commit this removes nothing; on an error or a cancel it drops the
            # temporary file, in a thread: it waits for the write lock, which a commit or
            # digest check holds through an fsync of the whole file (seconds for a big
            # one), and the event loop must not wait with it.
            if staged is not None:
                await run_to_the_end(staged.abort)

    async def _commit_write(
        self,
        context: Context,
        header: _Header,
        admitted: Admitted,
        staged: StagedWrite | None,
        whole: bytes,
        stated: Digest | None,
        *,
        call: str,
    ) -> agent_pb2.PutResponse:
        """Commit an admitted Put (`staged`, or the bytes `whole` when small), replicate
        it per its class and answer with its version once it may be acked."""
        dataset, key, set_id = header.dataset, header.key, header.set_id
        # The decision's time, beside the commit's (structlog's timestamp): the
        # split-brain checker needs when the epoch was judged current.
        admitted_at = time.time()
        _before_commit(context, call)
        how = _Commit(
            set_id=set_id,
            outbox=not admitted.critical,
            epoch=admitted.epoch,
            policy_revision=admitted.policy_revision,
        )
        local: asyncio.Future[Version] | None = None
        if staged is None:
            # Kept inline in the store's database (no file to create, rename and sync):
            # stamped here, committed by one thread with the other small Puts queued
            # meanwhile (small_puts.py). A cancelled call stops waiting; its write goes on.
            version, local = await self.small_puts.put(
                SmallPut(
                    dataset,
                    key,
                    whole,
                    header.size,
                    self.max_object_bytes,
                    header.digest,
                    stated,
                    **how,
                )
            )
            if not (admitted.critical and self.replication is not None):
                version = await local
                local = None
            # Else pushed while it commits here, from its stamp: the ack still waits
            # for this commit to be durable, and counts this region only then.
        else:
            version = await asyncio.to_thread(
                functools.partial(self.store.commit_put, staged, **how)
            )

        def stored(version: Version) -> None:
            log.info(
                "object_stored",
                dataset=dataset,
                key=key,
                version=str(version.hlc),
                size=version.size,
                epoch=admitted.epoch or None,
                admitted_at=admitted_at,
            )

        def committed(done: asyncio.Future[Version]) -> None:
            if not done.cancelled() and done.exception() is None:
                stored(done.result())

        if local is None:
            stored(version)
        else:  # logged as it commits, as the others are
            local.add_done_callback(committed)
        data = whole if staged is None else None
        regions = await self._after_write(
            CommittedWrite(
                admitted, dataset, key=key, version=version, set_id=set_id, data=data, local=local
            )
        )
        if local is not None:
            # Done: the ack waited for it (raises what it raised). Shielded, as in the
            # ack: a cancelled call must not cancel the commit's task while its thread
            # still commits (a takeover pass waits on that task, `_commits_ended`).
            await asyncio.shield(local)
        return agent_pb2.PutResponse(version=version_to_wire(version), regions=regions)

    def _stage(
        self, dataset: str, key: str, size: int | None, digest: Digest | None, held: list[bytes]
    ) -> StagedWrite:
        """Stage a Put (in a thread), with the chunks held so far written to it."""
        staged = self.store.stage(
            dataset,
            key,
            expected_size=size,
            max_size=self.max_object_bytes,
            expected_digest=digest,
        )
        try:
            for chunk in held:
                staged.write(chunk)
        except BaseException:
            staged.abort()
            raise
        return staged

    async def Delete(  # noqa: N802
        self, request: agent_pb2.DeleteRequest, context: Context
    ) -> agent_pb2.DeleteResponse:
        return await unary("Delete", context, self.metrics, lambda: self._delete(request, context))

    async def _delete(
        self, request: agent_pb2.DeleteRequest, context: Context
    ) -> agent_pb2.DeleteResponse:
        dataset = requests.name("DeleteRequest.dataset", request.dataset)
        key = requests.name("DeleteRequest.key", request.key)
        set_id = requests.set_id("DeleteRequest.set", request.HasField("set"), request.set)
        epoch = requests.epoch(request.HasField("epoch"), request.epoch)
        admitted = await self.admission.admit_write(dataset, epoch)
        if set_id is not None and self.holding_sets is not None:
            await self.holding_sets()
        _before_commit(context, "Delete")
        version = await asyncio.to_thread(
            self.store.delete,
            dataset,
            key,
            set_id=set_id,
            outbox=not admitted.critical,
            epoch=admitted.epoch,
            policy_revision=admitted.policy_revision,
        )
        log.info("object_deleted", dataset=dataset, key=key, version=str(version.hlc))
        regions = await self._after_write(
            CommittedWrite(admitted, dataset, key=key, version=version, set_id=set_id)
        )
        return agent_pb2.DeleteResponse(version=version_to_wire(version), regions=regions)

    async def Evict(  # noqa: N802
        self, request: agent_pb2.EvictRequest, context: Context
    ) -> agent_pb2.EvictResponse:
        return await unary("Evict", context, self.metrics, lambda: self._evict(request))

    async def _evict(self, request: agent_pb2.EvictRequest) -> agent_pb2.EvictResponse:
        dataset = requests.name("EvictRequest.dataset", request.dataset)
        if len(request.keys) > MAX_EVICT_KEYS:
            raise InvalidInputError(
                f"EvictRequest.keys: at most {MAX_EVICT_KEYS} per call, got {len(request.keys)}"
            )
        keys = [
            (
                requests.name(f"EvictRequest.keys[{i}].key", k.key),
                hlc_from_wire(k.version, f"EvictRequest.keys[{i}].version"),
            )
            for i, k in enumerate(request.keys)
        ]
        proven = [
            (
                str(requests.set_id(f"EvictRequest.sets[{i}].id", True, s.id)),
                hlc_from_wire(s.hlc, f"EvictRequest.sets[{i}].hlc").text,
            )
            for i, s in enumerate(request.sets)
        ]
        await self._refuse_evict(dataset, request.placement_digest)
        done = await asyncio.to_thread(self.store.evict, dataset, keys, proven)
        self.metrics.evicted_objects.labels(dataset=dataset).inc(done.objects)
        partials = 0
        if self.transfers is not None:
            # A cut pull's partial bytes of a forgotten version are a copy here too.
            kept = {key for key, _ in done.kept}
            gone = {key: at.text for key, at in keys if key not in kept}
            try:
                partials = await asyncio.to_thread(self.transfers.drop_evicted, dataset, gone)
            except OSError as exc:  # the copies went: their partials expire in time
                log.warning("evict_partials_left", dataset=dataset, error=str(exc))
        log.info(
            "dataset_evicted",
            dataset=dataset,
            objects=done.objects,
            versions=done.versions,
            bytes=done.bytes,
            kept=len(done.kept),
            partial_pulls=partials,
        )
        return agent_pb2.EvictResponse(
            objects=done.objects,
            versions=done.versions,
            bytes=done.bytes,
            kept=[agent_pb2.EvictKept(key=k, why=why) for k, why in done.kept],
        )

    async def _refuse_evict(self, dataset: str, proven_under: str) -> None:
        """Refuse an eviction here on the rule of `controlplane.domain.eviction`, judged
        on the policy and the owner as this agent sees them now: whatever the caller
        believed when it proved the copies held elsewhere. A proof made under another
        placement than this agent's (`proven_under`, its digest; empty: not said) is
        refused as retriable: this agent lags etcd, or the policy changed since."""
        placement = self.admission.placement(dataset)
        if proven_under and placement_digest(placement) != proven_under:
            raise UnavailableError(
                f"dataset {dataset}: the eviction was proven under another placement than "
                "the applied policy, as this agent sees it, gives; run it again once this "
                "agent has seen the policy the CLI read (or re-apply the policy)"
            )
        owner = None
        if self.region not in (*placement.regions, *placement.failover_order):
            found = await self.admission.owner_now(dataset)
            if found is not None:
                owner = OwnerSeen(found.region, found.epoch, found.handover_to)
        why = eviction_refused(placement, self.region, owner, seen_by="this agent")
        if why is not None:
            raise RefusedError(why)

    async def CommitSet(  # noqa: N802
        self, request: agent_pb2.CommitSetRequest, context: Context
    ) -> agent_pb2.CommitSetResponse:
        return await unary(
            "CommitSet", context, self.metrics, lambda: self._commit_set(request, context)
        )

    async def _commit_set(
        self, request: agent_pb2.CommitSetRequest, context: Context
    ) -> agent_pb2.CommitSetResponse:
        if not request.HasField("set"):
            raise InvalidInputError("CommitSetRequest.set is missing")
        if request.set.hlc:
            raise InvalidInputError(
                "CommitSetRequest.set.hlc: the agent assigns a set's HLC; leave it empty"
            )
        wanted = version_set_from_wire(request.set, "CommitSetRequest.set", stamped=False)
        requests.set_id("CommitSetRequest.set.id", True, wanted.id)
        epoch = requests.epoch(request.HasField("epoch"), request.epoch)
        admitted = await self.admission.admit_write(wanted.dataset, epoch)
        if self.holding_sets is not None:
            await self.holding_sets()
        _before_commit(context, "CommitSet")
        record = await asyncio.to_thread(
            self.store.commit_set,
            wanted.dataset,
            wanted.id,
            {m.key: m.version for m in wanted.members},
            outbox=not admitted.critical,
            epoch=admitted.epoch,
            policy_revision=admitted.policy_revision,
        )
        log.info(
            "set_committed",
            dataset=record.dataset,
            set=record.set_id,
            hlc=str(record.hlc),
            members=len(record.members),
        )
        regions = await self._after_write(
            CommittedWrite(admitted, record.dataset, set_id=record.set_id, set_record=record)
        )
        return agent_pb2.CommitSetResponse(
            set=version_set_to_wire(record.as_version_set()), regions=regions
        )

    async def _after_write(self, write: CommittedWrite) -> tuple[str, ...]:
        """The regions holding the committed write once it may be acked (replication
        raises when it may not)."""
        if write.admitted.critical and self.replication is not None:
            return await self.replication.replicate(write)
        return (self.region,)

    # -- reads ---------------------------------------------------------------------------

    # grpc serves a server stream only from an async generator function, hence the loops.
    async def Get(  # noqa: N802
        self, request: agent_pb2.GetRequest, context: Context
    ) -> AsyncIterator[agent_pb2.GetResponse]:
        async for msg in stream("Get", context, self.metrics, self._get(request)):
            yield msg

    async def _get(self, request: agent_pb2.GetRequest) -> AsyncIterator[agent_pb2.GetResponse]:
        dataset = requests.name("GetRequest.dataset", request.dataset)
        key = requests.name("GetRequest.key", request.key)
        hlc = requests.version("GetRequest.version", request.HasField("version"), request.version)
        set_id = requests.optional_name("GetRequest.set", request.HasField("set"), request.set)
        try:
            reader = await open_in_thread(
                functools.partial(self.store.open, dataset, key, hlc, set_id=set_id)
            )
        except NotFoundError:
            cache = self._cache_for(dataset, set_id)
            if cache is None:
                raise
            reader = await cache.open(dataset, key, hlc)
        try:
            yield agent_pb2.GetResponse(header=version_to_wire(reader.version))
            while chunk := await asyncio.to_thread(reader.read, CHUNK_BYTES):
                yield agent_pb2.GetResponse(chunk=chunk)
        finally:
            reader.close()

    async def Stat(  # noqa: N802
        self, request: agent_pb2.StatRequest, context: Context
    ) -> agent_pb2.StatResponse:
        return await unary("Stat", context, self.metrics, lambda: self._stat(request))

    async def _stat(self, request: agent_pb2.StatRequest) -> agent_pb2.StatResponse:
        dataset = requests.name("StatRequest.dataset", request.dataset)
        key = requests.name("StatRequest.key", request.key)
        hlc = requests.version("StatRequest.version", request.HasField("version"), request.version)
        try:
            stored = await asyncio.to_thread(self.store.stat, dataset, key, hlc)
        except NotFoundError:
            cache = self._cache_for(dataset, None)
            if cache is None:
                raise
            info = await cache.stat(dataset, key, hlc)
            return agent_pb2.StatResponse(object=info)
        return agent_pb2.StatResponse(object=_info(stored))

    def _cache_for(self, dataset: str, set_id: str | None) -> ReadThrough | None:
        """The cache, when a read this store cannot answer goes through it (a set's
        member never does: a set is read where it is committed)."""
        cache = self.cache
        if cache is None or set_id is not None or not cache.serves(dataset):
            return None
        return cache

    async def List(  # noqa: N802
        self, request: agent_pb2.ListRequest, context: Context
    ) -> agent_pb2.ListResponse:
        return await unary("List", context, self.metrics, lambda: self._list(request))

    async def _list(self, request: agent_pb2.ListRequest) -> agent_pb2.ListResponse:
        dataset, prefix, limit = requests.list_query(request)
        if request.complete:
            # A new owner's takeover pass: what was acked here for a deposed owner is
            # committed before it is listed (Admission.settle_for_listing). Every page:
            # a region's listing pages by key, so an agent that joined the region since
            # the first page is first asked for a later one.
            await self.admission.settle_for_listing(dataset)
        page = await asyncio.to_thread(
            self.store.list_objects,
            dataset,
            prefix,
            cursor=request.page_token or None,
            limit=limit,
            include_deleted=request.include_deleted,
        )
        # One agent's own listing: its newest of each key is the lowest and the highest.
        return agent_pb2.ListResponse(
            objects=[_info(s) for s in page.items],
            next_page_token=page.cursor or "",
            lowest=request.lowest,
        )

    async def GetSet(  # noqa: N802
        self, request: agent_pb2.GetSetRequest, context: Context
    ) -> agent_pb2.GetSetResponse:
        return await unary("GetSet", context, self.metrics, lambda: self._get_set(request))

    async def _get_set(self, request: agent_pb2.GetSetRequest) -> agent_pb2.GetSetResponse:
        dataset, wanted = requests.set_query(request)
        record = await asyncio.to_thread(self.store.get_set, dataset, wanted)
        return agent_pb2.GetSetResponse(set=version_set_to_wire(record.as_version_set()))

    async def Health(  # noqa: N802
        self, request: agent_pb2.HealthRequest, context: Context
    ) -> agent_pb2.HealthResponse:
        return await unary("Health", context, self.metrics, self._health)

    async def _health(self) -> agent_pb2.HealthResponse:
        usage = await asyncio.to_thread(self.store.usage)
        self.metrics.objects.set(usage.objects)
        self.metrics.bytes_stored.set(usage.bytes)
        return agent_pb2.HealthResponse(
            live=True,
            region=self.region,
            agent_id=self.agent_id,
            store=agent_pb2.StoreUsage(
                objects=usage.objects, bytes_stored=usage.bytes, bytes_free=usage.bytes_free
            ),
            tombstone_retention_ms=1000 * self.store.tombstone_retention_s,
            now_ms=int(time.time() * 1000),
        )

    # -- transfers (delegated) -------------------------------------------------------------

    async def Signature(  # noqa: N802
        self, request: agent_pb2.SignatureRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SignatureResponse]:
        gen = (
            _unimplemented("Signature", context)
            if self.transfers is None
            else self.transfers.Signature(request, context)
        )
        async for msg in stream("Signature", context, self.metrics, gen):
            yield msg

    async def Sync(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.SyncRequest], context: Context
    ) -> AsyncIterator[agent_pb2.SyncResponse]:
        gen = (
            _unimplemented("Sync", context)
            if self.transfers is None
            else self.transfers.Sync(request_iterator, context)
        )
        async for msg in stream("Sync", context, self.metrics, gen):
            yield msg

    async def Replicate(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.ReplicateRequest], context: Context
    ) -> agent_pb2.ReplicateResponse:
        transfers = self.transfers
        if transfers is None:
            return await unary(
                "Replicate",
                context,
                self.metrics,
                lambda: _refuse_unimplemented("Replicate", context),
            )
        return await unary(
            "Replicate",
            context,
            self.metrics,
            lambda: transfers.Replicate(request_iterator, context),
        )

    async def Fetch(  # noqa: N802
        self, request: agent_pb2.FetchRequest, context: Context
    ) -> agent_pb2.FetchResponse:
        transfers = self.transfers
        if transfers is None:
            return await unary(
                "Fetch", context, self.metrics, lambda: _refuse_unimplemented("Fetch", context)
            )
        return await unary(
            "Fetch", context, self.metrics, lambda: transfers.Fetch(request, context)
        )

    async def SyncBundle(  # noqa: N802
        self, request: agent_pb2.SyncBundleRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SyncBundleResponse]:
        gen = (
            _unimplemented("SyncBundle", context)
            if self.transfers is None
            else self.transfers.SyncBundle(request, context)
        )
        async for msg in stream("SyncBundle", context, self.metrics, gen):
            yield msg

    async def FetchMany(  # noqa: N802
        self, request: agent_pb2.FetchManyRequest, context: Context
    ) -> agent_pb2.FetchManyResponse:
        transfers = self.transfers
        if transfers is None:
            return await unary(
                "FetchMany",
                context,
                self.metrics,
                lambda: _refuse_unimplemented("FetchMany", context),
            )
        return await unary(
            "FetchMany", context, self.metrics, lambda: transfers.FetchMany(request, context)
        )

    async def ReplicateSet(  # noqa: N802
        self, request: agent_pb2.ReplicateSetRequest, context: Context
    ) -> agent_pb2.ReplicateSetResponse:
        sets = self.sets
        if sets is None:
            return await unary(
                "ReplicateSet",
                context,
                self.metrics,
                lambda: _refuse_unimplemented("ReplicateSet", context),
            )
        return await unary(
            "ReplicateSet", context, self.metrics, lambda: sets.receive_sets(request)
        )

    async def ReplicateMany(  # noqa: N802
        self, request: agent_pb2.ReplicateManyRequest, context: Context
    ) -> agent_pb2.ReplicateManyResponse:
        transfers = self.transfers
        if transfers is None:
            return await unary(
                "ReplicateMany",
                context,
                self.metrics,
                lambda: _refuse_unimplemented("ReplicateMany", context),
            )
        return await unary(
            "ReplicateMany",
            context,
            self.metrics,
            lambda: transfers.ReplicateMany(request, context),
        )

    async def ReplicatePushes(  # noqa: N802
        self, request: agent_pb2.ReplicatePushesRequest, context: Context
    ) -> agent_pb2.ReplicatePushesResponse:
        pushes = self.pushes
        if pushes is None or not pushes.serves():
            return await unary(
                "ReplicatePushes",
                context,
                self.metrics,
                lambda: _refuse_unimplemented("ReplicatePushes", context),
            )
        return await unary(
            "ReplicatePushes", context, self.metrics, lambda: pushes.receive(request)
        )

    async def Rewind(  # noqa: N802
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse:
        transfers = self.transfers
        if transfers is None:
            return await unary(
                "Rewind", context, self.metrics, lambda: _refuse_unimplemented("Rewind", context)
            )
        return await unary(
            "Rewind", context, self.metrics, lambda: transfers.Rewind(request, context)
        )


def _info(stored: StoredVersion) -> agent_pb2.ObjectInfo:
    info = agent_pb2.ObjectInfo(
        dataset=stored.dataset, key=stored.key, version=version_to_wire(stored.version)
    )
    if stored.set_id is not None:
        info.set = stored.set_id
    if stored.state == "missing":
        info.missing = True
    return info


@dataclass(frozen=True, slots=True)
class _Header:
    """A Put's header, checked (the same for Put and PutSmall)."""

    dataset: str
    key: str
    set_id: str | None
    epoch: int | None
    size: int | None
    digest: Digest | None

    @classmethod
    def of(cls, header: agent_pb2.PutHeader, max_object_bytes: int | None) -> _Header:
        dataset = requests.name("PutHeader.dataset", header.dataset)
        key = requests.name("PutHeader.key", header.key)
        set_id = requests.set_id("PutHeader.set", header.HasField("set"), header.set)
        epoch = requests.epoch(header.HasField("epoch"), header.epoch)
        size = header.size if header.HasField("size") else None
        digest = requests.digest("PutHeader.digest", header.HasField("digest"), header.digest)
        if size is not None and max_object_bytes is not None and size > max_object_bytes:
            raise TooLargeError(
                f"PutHeader.size: {dataset}/{key} would be {size} bytes, more than this "
                f"agent's cap of {max_object_bytes}; nothing was stored"
            )
        return cls(dataset, key, set_id, epoch, size, digest)


class _Commit(TypedDict):
    """How a Put commits (`ObjectStore.commit_put` / `put_small`), as admitted."""

    set_id: str | None
    outbox: bool
    epoch: int
    policy_revision: int


def _check_digest(staged: StagedWrite, stated: Digest) -> None:
    found = staged.finish()
    if found != stated:
        raise DigestMismatchError(
            f"object {staged.dataset}/{staged.key} hashed to {found}, not the stated {stated}; "
            "nothing was stored"
        )


def check_small(request: agent_pb2.PutSmallRequest, max_object_bytes: int | None) -> _Header:
    """A PutSmall's header, checked (as a Put's would be), then its size: more than a
    PutSmall holds is a TooLargeError. The lone agent's order and the routed one's."""
    header = _Header.of(request.header, max_object_bytes)
    if len(request.data) > INLINE_BYTES:
        raise TooLargeError(
            f"PutSmallRequest.data: {request.header.dataset}/{request.header.key} is "
            f"{len(request.data)} bytes, more than the {INLINE_BYTES} a PutSmall carries "
            "(send it with Put); nothing was stored"
        )
    return header


def _before_commit(context: Context, call: str) -> None:
    """Refuse to commit once the caller's deadline has passed: it has given up on the
    answer, so nothing is stored on its behalf."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise OperationTimeoutError(
            f"the {call} call's deadline passed before its commit; nothing was stored"
        )


async def _refuse_unimplemented(call: str, context: Context) -> Never:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED, f"this agent does not serve {call} yet (no transfers)"
    )
    raise AssertionError("grpc's abort returned")  # pragma: no cover - abort always raises


async def _unimplemented(call: str, context: Context) -> AsyncIterator[Never]:
    await _refuse_unimplemented(call, context)
    yield  # pragma: no cover - makes this an async generator
