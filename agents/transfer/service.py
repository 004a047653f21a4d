"""`TransferService`: the agent's Signature, Sync (sender), Replicate (receiver) and
Fetch handlers, which the agent's servicer (agents/service/) delegates to.

- Signature: the engine signature of a held version.
- Sync: see sender.py.
- Replicate: a version pushed by its owner (critical, with its epoch: fenced by
  `admit_replica`) or by the replicator (epoch 0, a standard dataset's inline event or
  delete: an LWW apply); acked only after the commit. A push naming a basis carries
  delta frames (agents/replication/delta_push.py), answered `basis_missing` at once
  when this agent does not hold that basis.
- Fetch: pull a version from the holders given (nearest first, by the policy's RTT),
  falling back to the next on a retriable failure; a refusal is final.
Every copy in is recorded in the store's journal with the version it committed (or
on its own when refused or failed) and counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import grpc

import native
from agents.errors import ResidencyError
from agents.metrics import AgentMetrics
from agents.replication.answers import OUTCOMES as _OUTCOMES
from agents.replication.answers import journal
from agents.replication.answers import refusal as _refusal
from agents.replication.delta_push import PUSH_DELTA, holds_basis, receive_delta
from agents.rpc.status import abort, code_of, rebuilt
from agents.store import ApplyResult, ObjectStore
from agents.store.errors import DigestMismatchError, NoRoomError
from agents.store.staging import TMP
from agents.to_the_end import open_in_thread, run_to_the_end
from agents.transfer.bridge import file_chunks, remove
from agents.transfer.bundle import BUNDLE_MAX_BYTES, BundleSender, Wanted, pull_bundle
from agents.transfer.limiter import CHUNK_BYTES, LinkLimiter
from agents.transfer.ports import AdmissionPort, PolicySource
from agents.transfer.pull import Source, pull
from agents.transfer.records import Outcome, TransferTally, count_many, new_transfer_id
from agents.transfer.resume import CHECKPOINT_BYTES, ResumeBook
from agents.transfer.sender import SyncSender, _file
from agents.transfer.sources import order_sources
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version, lww
from controlplane.errors import (
    FencedError,
    HandingOverError,
    InvalidInputError,
    MeridianError,
    NotFoundError,
    RefusedError,
    UnavailableError,
)
from controlplane.logs import get_logger
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2, types_pb2

log = get_logger(__name__)

MOVE_BUNDLE_MAX_BYTES = 4 << 20  # objects a move inside the region bundles (_classify)

Context = grpc.aio.ServicerContext[object, object]


class TransferService:
    def __init__(
        self,
        store: ObjectStore,
        admission: AdmissionPort,
        region: str,
        metrics: AgentMetrics,
        limiter: LinkLimiter | None = None,
        policy: PolicySource | None = None,
        *,
        threads: int = 2,
        checkpoint_bytes: int = CHECKPOINT_BYTES,
        bundle_max_bytes: int = BUNDLE_MAX_BYTES,
    ) -> None:
        self.store = store
        # Objects below this travel in bundles (the `bundle_max_bytes` setting; 0: none),
        # and new objects moved inside the region below the larger of it and
        # MOVE_BUNDLE_MAX_BYTES (see _classify).
        self.bundle_max_bytes = bundle_max_bytes
        self.move_bundle_max_bytes = (
            max(bundle_max_bytes, MOVE_BUNDLE_MAX_BYTES) if bundle_max_bytes > 0 else 0
        )
        self.admission = admission
        self.region = region
        self.metrics = metrics
        self.limiter = limiter or LinkLimiter()
        self.policy: PolicySource = policy or (lambda: None)
        self.threads = threads
        self.checkpoint_bytes = checkpoint_bytes
        self.book = ResumeBook(store.root)
        self.book.expire()
        self.sender = SyncSender(
            store, admission, region, metrics, self.limiter, self.policy, threads=threads
        )
        self.bundler = BundleSender(store, admission, region, metrics, self.limiter, self.policy)
        # One pull per version at a time; an entry lives while someone holds or awaits it.
        self._pulling: dict[tuple[str, str, str], _Pulling] = {}
        # Awaited before a member of a version set is stored (the daemon's roster
        # lowering: a set's members stay on this agent alone).
        self.holding_sets: Callable[[], Awaitable[None]] | None = None

    def drop_evicted(self, dataset: str, evicted: Mapping[str, str]) -> int:
        """Forget the partial pulls of what an eviction forgot (ResumeBook.drop_evicted)."""
        return self.book.drop_evicted(dataset, evicted)

    # -- Signature ---------------------------------------------------------------------

    async def Signature(  # noqa: N802 - the generated servicer's name
        self, request: agent_pb2.SignatureRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SignatureResponse]:
        try:
            version = request.version if request.HasField("version") else None
            reader = await open_in_thread(
                functools.partial(self.store.open, request.dataset, request.key, version)
            )
            try:
                fd, path = tempfile.mkstemp(
                    prefix="sig-", suffix=".part", dir=self.store.root / TMP
                )
            except BaseException:  # a full disk, say: the reader is not left open
                reader.close()
                raise
            os.close(fd)
            try:
                old = _file(reader)
                try:
                    await asyncio.to_thread(native.signature, old, path, threads=self.threads)
                finally:
                    old.close()
                    reader.close()
                yield agent_pb2.SignatureResponse(header=version_to_wire(reader.version))
                async for chunk in file_chunks(path, CHUNK_BYTES):
                    yield agent_pb2.SignatureResponse(chunk=chunk)
            finally:
                await remove(path)
        except MeridianError as exc:
            await abort(context, exc)

    # -- Sync (this agent sends) -------------------------------------------------------

    async def Sync(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.SyncRequest], context: Context
    ) -> AsyncIterator[agent_pb2.SyncResponse]:
        try:
            async for response in self.sender.serve(request_iterator):
                yield response
        except MeridianError as exc:
            await abort(context, exc)

    async def SyncBundle(  # noqa: N802
        self, request: agent_pb2.SyncBundleRequest, context: Context
    ) -> AsyncIterator[agent_pb2.SyncBundleResponse]:
        try:
            async for response in self.bundler.serve(request):
                yield response
        except MeridianError as exc:
            await abort(context, exc)

    # -- Replicate (this agent receives a pushed version) ------------------------------

    async def Replicate(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.ReplicateRequest], context: Context
    ) -> agent_pb2.ReplicateResponse:
        try:
            return await self._replicate(request_iterator)
        except MeridianError as exc:
            await abort(context, exc)

    async def _replicate(
        self, requests: AsyncIterator[agent_pb2.ReplicateRequest]
    ) -> agent_pb2.ReplicateResponse:
        first = await anext(requests, None)
        if first is None or first.WhichOneof("frame") != "header":
            raise InvalidInputError("a Replicate must begin with its header")
        header = first.header
        version = version_from_wire(header.version, "ReplicateHeader.version")
        tally = TransferTally(
            new_transfer_id(),
            header.dataset,
            header.key,
            header.origin_region or version.hlc.region,
            self.region,
            "in",
            method="push",
            logical_bytes=version.size,
            policy_revision=header.policy_revision or None,
        )
        set_id = header.set if header.HasField("set") else None

        def admit(fresh_read_next: bool = False) -> Placement:
            placement = self.admission.admit_store(header.dataset)
            if placement.dataset_class == "critical":
                # Fence (the watched newest epoch) now, and etcd's owner record again just
                # before the commit (below): a deposed owner's copy is never acked here.
                self.admission.admit_replica(
                    header.dataset,
                    header.epoch,
                    tally.from_region,
                    fresh_read_next=fresh_read_next,
                )
            elif header.epoch:
                raise InvalidInputError(
                    f"ReplicateHeader.epoch: {header.dataset} is a standard dataset, which "
                    f"takes epoch 0, not {header.epoch}"
                )
            return placement

        try:
            placement = admit()
        except (RefusedError, FencedError, HandingOverError) as exc:
            await self._record(tally, "refused", version, str(exc))
            raise
        if set_id is not None and self.holding_sets is not None:
            await self.holding_sets()
        critical = placement.dataset_class == "critical"
        delta = header.HasField("basis") and bool(header.basis.version)
        if delta and not await asyncio.to_thread(holds_basis, self.store, header):
            # Answered before any frame is read: the owner pushes it whole (issue 13).
            return agent_pb2.ReplicateResponse(
                version=version_to_wire(version), region=self.region, basis_missing=True
            )
        if delta:
            tally.method = PUSH_DELTA
        try:
            if version.is_tombstone:
                with self.admission.receiving([header.dataset] if critical else []):
                    if critical:
                        await self._admit_current(header, tally.from_region)
                    result = await run_to_the_end(
                        functools.partial(
                            self.store.apply,
                            header.dataset,
                            header.key,
                            version,
                            None,
                            set_id=set_id,
                            transfer=tally.record("completed", self.policy),
                        )
                    )
            else:
                result = await self._receive_pushed(
                    header, version, set_id, requests, tally, admit, critical=critical
                )
        except (RefusedError, FencedError, HandingOverError) as exc:
            await self._record(tally, "refused", version, str(exc))
            raise
        except MeridianError as exc:
            await self._record(tally, "failed", version, str(exc))
            raise
        if not result.verdict.applies and not result.restored:
            await self._record(tally, "skipped", version, result.verdict.value)
        else:
            tally.count(self.metrics, "completed")
        return agent_pb2.ReplicateResponse(
            version=version_to_wire(result.newest), region=self.region
        )

    # -- ReplicateMany (the replicator's batch of inline puts and deletes) --------------

    async def ReplicateMany(  # noqa: N802
        self, request: agent_pb2.ReplicateManyRequest, context: Context
    ) -> agent_pb2.ReplicateManyResponse:
        try:
            return await self.replicate_many(request)
        except MeridianError as exc:
            await abort(context, exc)

    async def replicate_many(
        self, request: agent_pb2.ReplicateManyRequest
    ) -> agent_pb2.ReplicateManyResponse:
        """Each item as a standard Replicate (epoch 0), admitted on its own; the admitted
        ones applied by LWW in ONE `apply_many` (one transaction, one syncfs), each with
        its own transfer record. A refused item is answered with its error and recorded
        refused; a malformed item (a bad version, bytes that do not match it) fails the
        call and stores nothing."""
        items = request.items
        # Each item's answer: a refusal's as made, an applied one's (outcome, held) pair.
        answers: list[agent_pb2.ReplicateItemResult | tuple[int, types_pb2.Version]] = [
            _NO_ANSWER
        ] * len(items)
        admitted: list[tuple[int, agent_pb2.ReplicateItem, Version, TransferTally]] = []
        # A dataset admitted once is admitted for the rest of the call (as if decided
        # at its start); a refusal is decided, counted and recorded item by item.
        standard: set[str] = set()
        for n, item in enumerate(items):
            version = version_from_wire(item.version, f"ReplicateManyRequest.items[{n}].version")
            if version.is_tombstone and item.data:
                raise InvalidInputError(
                    f"ReplicateManyRequest.items[{n}]: the delete of {item.dataset}/{item.key} "
                    "carries bytes"
                )
            tally = TransferTally(
                new_transfer_id(),
                item.dataset,
                item.key,
                item.origin_region or version.hlc.region,
                self.region,
                "in",
                method="push",
                logical_bytes=version.size,
                wire_bytes=len(item.data),
                policy_revision=item.policy_revision or None,
            )
            if item.dataset not in standard:
                try:
                    placement = self.admission.admit_store(item.dataset)
                    if placement.dataset_class == "critical":
                        raise InvalidInputError(
                            f"ReplicateManyRequest.items[{n}]: {item.dataset} is a critical "
                            "dataset; its copies are pushed one by one with Replicate and an "
                            "epoch"
                        )
                except MeridianError as exc:
                    answers[n] = _refusal(exc)
                    if isinstance(exc, RefusedError):
                        await self._record(tally, "refused", version, str(exc))
                    continue
                standard.add(item.dataset)
            admitted.append((n, item, version, tally))
        if admitted:
            batch = [
                (item.dataset, item.key, version, None if version.is_tombstone else [item.data])
                for _, item, version, _ in admitted
            ]
            transfers = [tally.record("completed", self.policy) for _, _, _, tally in admitted]
            applied = await asyncio.to_thread(self.store.apply_many, batch, transfers=transfers)
            ended: list[tuple[TransferTally, Outcome]] = []
            for (n, item, version, tally), got in zip(admitted, applied, strict=True):
                # Held is most often the very version sent: its wire form as it came
                # (parsed and checked above), not made again.
                newest = got.newest
                held = item.version if newest == version else version_to_wire(newest)
                answers[n] = (_OUTCOMES[got.verdict], held)
                # A no-op (a replay, an older version) is counted, not journalled: a
                # replay of the log would otherwise write a record per event.
                ended.append(
                    (tally, "completed" if got.verdict.applies or got.restored else "skipped")
                )
            count_many(self.metrics, ended)
        response = agent_pb2.ReplicateManyResponse()
        results = response.results
        for answer in answers:
            if isinstance(answer, tuple):
                results.add(outcome=answer[0], held=answer[1])
            else:
                results.append(answer)
        return response

    # -- Rewind (the owner's takeover pass drops a deposed owner's unacked write) --------

    async def Rewind(  # noqa: N802
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse:
        try:
            return await self.rewind(request)
        except MeridianError as exc:
            await abort(context, exc)

    async def rewind(self, request: agent_pb2.RewindRequest) -> agent_pb2.RewindResponse:
        """Fenced as a Replicate of a critical dataset (the watched epoch, then etcd's
        owner record read now): only the current owner drops a version here, a put or a
        delete (the owner proves either lone with a listing that shows tombstones)."""
        version = version_from_wire(request.version, "RewindRequest.version")
        placement = self.admission.admit_store(request.dataset)
        if placement.dataset_class != "critical":
            raise InvalidInputError(
                f"RewindRequest: {request.dataset} is a standard dataset; only a critical "
                "dataset's unacknowledged writes are rewound"
            )
        origin = request.origin_region
        await self.admission.admit_replica_current(
            request.dataset, request.epoch, origin, rewind=True
        )
        dropped = await asyncio.to_thread(self.store.rewind, request.dataset, request.key, version)
        log.info(
            "rewound_for_owner",
            dataset=request.dataset,
            key=request.key,
            version=version.hlc.text,
            owner=origin,
            epoch=request.epoch,
            dropped=dropped,
        )
        newest = await asyncio.to_thread(self.store.head, request.dataset, request.key)
        response = agent_pb2.RewindResponse(dropped=dropped, region=self.region)
        if newest is not None:
            response.newest.CopyFrom(version_to_wire(newest))
        return response

    async def _admit_current(self, header: agent_pb2.ReplicateHeader, origin: str) -> None:
        """etcd's owner record, read now, must still name the pusher (`origin`) at its
        epoch (a refusal is recorded by the caller)."""
        await self.admission.admit_replica_current(header.dataset, header.epoch, origin)

    async def _receive_pushed(
        self,
        header: agent_pb2.ReplicateHeader,
        version: Version,
        set_id: str | None,
        requests: AsyncIterator[agent_pb2.ReplicateRequest],
        tally: TransferTally,
        admit: Callable[[bool], object],
        *,
        critical: bool,
    ) -> ApplyResult:
        dataset, key = header.dataset, header.key
        if tally.method == PUSH_DELTA:  # patched over the basis as the frames arrive
            staged, tally.wire_bytes = await receive_delta(
                self.store, header, version, requests, threads=self.threads
            )
        else:
            staged = await asyncio.to_thread(
                self.store.stage,
                dataset,
                key,
                expected_size=version.size,
                expected_digest=version.digest,
            )
        try:
            async for request in requests:
                if request.WhichOneof("frame") != "chunk":
                    raise InvalidInputError("a Replicate sent a second header")
                tally.wire_bytes += len(request.chunk)
                await asyncio.to_thread(staged.write, request.chunk)
            # Admitted again at the commit: a failover (a newer epoch) or a narrowed
            # residency during a long stream refuses what the header let in; for a
            # critical dataset etcd's owner record is read again too (it, not the
            # watch, decides a handover then: one just ended may linger in the watch).
            admit(critical)
            # Between the owner read and the commit, a new owner's listing waits for it.
            with self.admission.receiving([dataset] if critical else []):
                if critical:
                    await self._admit_current(header, tally.from_region)
                # Held to its end when the call is cancelled: the registration and
                # the staged file (removed below) outlive the commit (to_the_end.py).
                return await run_to_the_end(
                    functools.partial(
                        self.store.commit_apply,
                        staged,
                        version,
                        set_id=set_id,
                        transfer=tally.record("completed", self.policy),
                    )
                )
        finally:
            staged.abort()  # after a commit this removes nothing

    @contextlib.asynccontextmanager
    async def _one_pull(self, name: tuple[str, str, str]) -> AsyncIterator[None]:
        """Serialise pulls of one version (a second waits, then finds it held); the entry
        goes once nobody holds or awaits it, so the map does not grow with every fetch."""
        entry = self._pulling.get(name)
        if entry is None:
            entry = self._pulling[name] = _Pulling()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                self._pulling.pop(name, None)

    # -- Fetch (this agent pulls) ------------------------------------------------------

    async def Fetch(  # noqa: N802
        self, request: agent_pb2.FetchRequest, context: Context
    ) -> agent_pb2.FetchResponse:
        try:
            return await self.fetch(request)
        except MeridianError as exc:
            await abort(context, exc)

    async def fetch(self, request: agent_pb2.FetchRequest) -> agent_pb2.FetchResponse:
        version = version_from_wire(request.version, "FetchRequest.version")
        dataset, key = request.dataset, request.key
        set_id = request.set if request.HasField("set") else None
        sources = [Source(s.region, s.address) for s in request.sources]
        tally = TransferTally(
            new_transfer_id(),
            dataset,
            key,
            sources[0].region if sources else request.origin_region,
            self.region,
            "in",
            logical_bytes=version.size,
            policy_revision=request.policy_revision or None,
        )
        try:
            self.admission.admit_store(dataset)
        except RefusedError as exc:
            tally.method = "refused"
            # A partial copy an earlier attempt kept goes too (a narrowed residency).
            await asyncio.to_thread(self.book.drop, dataset, key, version.hlc.text)
            await self._record(tally, "refused", version, str(exc))
            raise
        if set_id is not None and self.holding_sets is not None:
            await self.holding_sets()

        # LWW, but also a restore of lost bytes, or a member older than its key's newest
        # that a set recorded here still needs (a takeover's adoption of a set records it
        # first, then pulls its members).
        async def unwanted() -> agent_pb2.FetchResponse | None:
            if await asyncio.to_thread(self.store.wanted, dataset, key, version, set_id):
                return None
            held = await asyncio.to_thread(self.store.head, dataset, key)
            # Superseded: a partial of this version will never be resumed.
            await asyncio.to_thread(self.book.drop, dataset, key, version.hlc.text)
            return agent_pb2.FetchResponse(
                outcome=_OUTCOMES[lww(version, held)], held=version_to_wire(held or version)
            )

        if (answer := await unwanted()) is not None:
            return answer
        if version.is_tombstone:
            tally.method = "tombstone"
            result = await asyncio.to_thread(
                self.store.apply,
                dataset,
                key,
                version,
                None,
                set_id=set_id,
                transfer=tally.record("completed", self.policy),
            )
            tally.count(self.metrics, "completed")
            return agent_pb2.FetchResponse(
                outcome=_OUTCOMES[result.verdict], held=version_to_wire(result.newest)
            )
        if not sources:
            raise InvalidInputError("FetchRequest.sources: a put needs at least one source")
        async with self._one_pull((dataset, key, version.hlc.text)):
            # A pull of this version that ended while this one waited may have stored
            # it: then there is nothing to send again.
            if (answer := await unwanted()) is not None:
                return answer
            errors: list[str] = []
            # Sources that failed for good (not holding it, or a damaged copy): when every
            # one did, the error is theirs (NOT_FOUND, DATA_LOSS), not a retriable one.
            lost: list[MeridianError] = []
            refused_here = False

            def admit() -> object:
                nonlocal refused_here
                try:
                    return self.admission.admit_store(dataset)
                except MeridianError:
                    refused_here = True
                    raise

            for source in order_sources(self.region, sources, self.policy):
                try:
                    pulled = await pull(
                        self.store,
                        self.book,
                        source,
                        dataset,
                        key,
                        version,
                        region=self.region,
                        metrics=self.metrics,
                        policy=self.policy,
                        set_id=set_id,
                        policy_revision=request.policy_revision or None,
                        threads=self.threads,
                        checkpoint_bytes=self.checkpoint_bytes,
                        admit=admit,
                    )
                except (ResidencyError, RefusedError, NoRoomError):
                    raise  # this region's own answer (or disk): no other source changes it
                except MeridianError as exc:
                    if refused_here:
                        raise  # this region's own answer at the commit: no source changes it
                    # That source's own trouble: it no longer holds the version (pruned,
                    # or an agent of its region that never did) or its copy is damaged;
                    # another source may still send it whole.
                    if not exc.retriable:
                        if not isinstance(exc, NotFoundError | DigestMismatchError):
                            # Final: no other source changes it; say which one was asked.
                            raise rebuilt(
                                type(exc), f"{source.region} ({source.address}): {exc}"
                            ) from exc
                        lost.append(exc)
                    errors.append(f"{source.region} ({source.address}): {exc}")
                    log.warning(
                        "fetch source failed; trying the next", source=source.region, error=str(exc)
                    )
                    continue
                result = pulled.result
                return agent_pb2.FetchResponse(
                    outcome=_OUTCOMES[result.verdict],
                    held=version_to_wire(result.newest),
                    source_region=source.region,
                    logical_bytes=pulled.tally.logical_bytes,
                    wire_bytes=pulled.tally.wire_bytes,
                )
        summary = f"no source could send {dataset}/{key} at {version.hlc}: " + "; ".join(errors)
        if lost and len(lost) == len(errors):
            raise type(lost[-1])(summary) from lost[-1]
        raise UnavailableError(summary)

    # -- FetchMany (this agent pulls many; small ones in bundles) -----------------------

    async def FetchMany(  # noqa: N802
        self, request: agent_pb2.FetchManyRequest, context: Context
    ) -> agent_pb2.FetchManyResponse:
        try:
            return await self.fetch_many(request)
        except MeridianError as exc:
            await abort(context, exc)

    async def fetch_many(self, request: agent_pb2.FetchManyRequest) -> agent_pb2.FetchManyResponse:
        """Each item held already (or older) is answered at once, small new ones travel
        in bundles (one SyncBundle per source), the others are fetched one by one.
        Pipelined: the first FIRST_SLICE_ITEMS items are classified and their bundle is
        on its way before the rest is classified (classifying thousands of items took
        0.1-0.3 s, with the link idle meanwhile); the rest then follows in a bundle of
        its own on the same link."""
        count = len(request.items)
        results: list[agent_pb2.FetchResponse] = [agent_pb2.FetchResponse() for _ in range(count)]
        errors = [""] * count
        singles: list[int] = []
        memo = _ClassifyMemo()

        def classify(begin: int, end: int) -> dict[Source, list[tuple[int, Wanted]]]:
            # On a thread: admission and LWW read the store.
            groups: dict[Source, list[tuple[int, Wanted]]] = {}
            part = request.items[begin:end]
            try:  # what is held, for every item at once (LWW), in a few lookups
                heads = self.store.heads([(item.dataset, item.key) for item in part])
            except MeridianError:
                heads = None  # a bad name or a repeated object: each is looked up alone
            for n, item in enumerate(part, begin):
                try:
                    self._classify(n, item, results, groups, singles, heads, memo)
                except MeridianError:
                    singles.append(n)  # fetched alone, which records and words its refusal
            return groups

        async def bundle(source: Source, group: list[tuple[int, Wanted]]) -> None:
            pulled = await pull_bundle(
                self.store,
                source,
                [w for _, w in group],
                region=self.region,
                metrics=self.metrics,
                policy=self.policy,
            )
            for (n, wanted), got in zip(group, pulled, strict=True):
                if isinstance(got, ApplyResult):
                    results[n] = agent_pb2.FetchResponse(
                        outcome=_OUTCOMES[got.verdict],
                        # The applied version is the one asked for: its wire form is at hand.
                        held=wanted.wire
                        if got.newest is wanted.version and wanted.wire is not None
                        else version_to_wire(got.newest),
                        source_region=source.region,
                        logical_bytes=wanted.version.size,
                    )
                elif isinstance(got, ResidencyError):
                    errors[n] = f"{code_of(got).name}: {got}"
                else:
                    singles.append(n)  # the next source, or this one alone

        bundles: list[asyncio.Task[None]] = []
        try:
            for begin, end in _slices(count):
                groups = await asyncio.to_thread(classify, begin, end)
                bundles += [
                    asyncio.ensure_future(bundle(source, group)) for source, group in groups.items()
                ]
            await asyncio.gather(*bundles)
        finally:
            for task in bundles:  # cancelled (the caller went away): none is left running
                task.cancel()
            await asyncio.gather(*bundles, return_exceptions=True)
        gate = asyncio.Semaphore(4)

        async def single(n: int) -> None:
            async with gate:
                try:
                    results[n] = await self.fetch(request.items[n])
                except MeridianError as exc:
                    errors[n] = f"{code_of(exc).name}: {exc}"

        await asyncio.gather(*(single(n) for n in sorted(set(singles))))
        return agent_pb2.FetchManyResponse(results=results, errors=errors)

    def _classify(
        self,
        n: int,
        item: agent_pb2.FetchRequest,
        results: list[agent_pb2.FetchResponse],
        groups: dict[Source, list[tuple[int, Wanted]]],
        singles: list[int],
        heads: dict[tuple[str, str], Version] | None = None,
        memo: _ClassifyMemo | None = None,
    ) -> None:
        """Put item n in a bundle of its nearest source, among the singles, or answer it
        at once (LWW: already held or older)."""
        memo = memo or _ClassifyMemo()
        version = version_from_wire(item.version, f"FetchManyRequest.items[{n}].version")
        # The sources by their names: a batch usually names the same ones for all items,
        # so Source values and their order are made once per distinct list (memo).
        names = tuple((s.region, s.address) for s in item.sources)
        # Set members go alone: apply_many commits no set membership.
        if (
            version.is_tombstone
            or version.size >= self.move_bundle_max_bytes
            or not names
            or item.HasField("set")
        ):
            singles.append(n)
            return
        if item.dataset not in memo.admitted:
            self.admission.admit_store(item.dataset)  # a refusal raises (and is counted)
            memo.admitted.add(item.dataset)
        held = (
            self.store.head(item.dataset, item.key)
            if heads is None
            else heads.get((item.dataset, item.key))
        )
        verdict = lww(version, held)
        if not verdict.applies:
            results[n] = agent_pb2.FetchResponse(
                outcome=_OUTCOMES[verdict], held=version_to_wire(held or version)
            )
            return
        nearest = memo.nearest.get(names)
        if nearest is None:
            sources = [Source(region, address) for region, address in names]
            nearest = memo.nearest[names] = order_sources(self.region, sources, self.policy)[0]
        if version.size >= self.bundle_max_bytes and (nearest.region != self.region or held):
            # Large: alone (resumable, a delta against the basis held). Only a move inside
            # the region of an object new to this agent rides the bundle up to
            # MOVE_BUNDLE_MAX_BYTES: on a fast link, one commit per batch instead of one per
            # object is what a rebalance of 1 MiB shards waits for.
            singles.append(n)
            return
        groups.setdefault(nearest, []).append(
            (n, Wanted(item.dataset, item.key, version, item.version))
        )

    async def _record(
        self, tally: TransferTally, outcome: Outcome, version: Version, reason: str
    ) -> None:
        await journal(self.store, self.policy, tally, outcome, version, reason)
        tally.count(self.metrics, outcome)


# A FetchMany's first slice: its bundle leaves after these are classified (~10 ms).
FIRST_SLICE_ITEMS = 256


# A ReplicateMany item not answered yet (each is answered before the call returns).
_NO_ANSWER = agent_pb2.ReplicateItemResult()


def _slices(count: int) -> list[tuple[int, int]]:
    """The [begin, end) parts a FetchMany of `count` items is classified in: a first
    small one, then the rest."""
    if count <= FIRST_SLICE_ITEMS:
        return [(0, count)]
    return [(0, FIRST_SLICE_ITEMS), (FIRST_SLICE_ITEMS, count)]


@dataclass
class _ClassifyMemo:
    """What one FetchMany decides once rather than per item: a batch of thousands of
    small objects usually names one or two datasets and the same sources for all."""

    admitted: set[str] = field(default_factory=set)
    nearest: dict[tuple[tuple[str, str], ...], Source] = field(default_factory=dict)


@dataclass
class _Pulling:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
