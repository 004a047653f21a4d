"""The receiving side of Sync: pull one version from a source agent, patch it as it
arrives, verify it, commit it by LWW with its transfer record; continue a cut
attempt from what this receiver durably holds (resume.py).

The receiver names its basis (the newest put it holds of the object, older than the
wanted version); the sender diffs against it if it still holds it, else asks for
its signature. Without a basis the content comes raw (compressed per chunk when the
policy says zstd). All disk and engine work runs on threads: the event loop only
moves messages between the gRPC stream and those threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import zstandard

import native
from agents.errors import ResidencyError
from agents.metrics import AgentMetrics
from agents.rpc.status import from_rpc_error
from agents.store import ApplyResult, ObjectReader, ObjectStore, StagedWrite, StoredVersion
from agents.store.errors import DigestMismatchError, NoRoomError
from agents.store.room import check_room
from agents.store.staging import TMP
from agents.to_the_end import run_to_the_end
from agents.transfer.bridge import ChunkPipe, PipeAbandonedError, file_chunks, remove
from agents.transfer.compress import ChunkDecompressor
from agents.transfer.limiter import CHUNK_BYTES
from agents.transfer.ports import PolicySource
from agents.transfer.records import Outcome, TransferTally
from agents.transfer.resume import CHECKPOINT_BYTES, Checkpointer, ResumeBook, ResumeState
from agents.transfer.sender import BASIS, RAW, SIGNATURE
from controlplane.domain.version import Version
from controlplane.errors import (
    InvalidInputError,
    MeridianError,
    NotFoundError,
    UnavailableError,
)
from controlplane.logs import get_logger
from meridian.convert import version_from_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc

log = get_logger(__name__)

MESSAGE_BYTES = CHUNK_BYTES + (64 << 10)  # a 1 MiB chunk plus its framing
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 4 * MESSAGE_BYTES),
    ("grpc.max_send_message_length", 4 * MESSAGE_BYTES),
)
DEFAULT_DEADLINE_S = 3600.0


@dataclass(frozen=True)
class Source:
    region: str
    address: str


@dataclass(frozen=True)
class PullResult:
    result: ApplyResult
    tally: TransferTally


def _file(reader: ObjectReader) -> io.FileIO:
    return io.FileIO(os.open(f"/proc/self/fd/{reader.fileno()}", os.O_RDONLY), "rb")


def pick_basis(
    store: ObjectStore, dataset: str, key: str, version: Version
) -> StoredVersion | None:
    """The newest put held, older than the wanted version, with its bytes present."""
    for held in store.versions(dataset, key):
        if held.version.is_tombstone or held.state != "present":
            continue
        if held.version.hlc < version.hlc:
            return held
    return None


class _Receiving:
    """The thread-side work of one attempt: write raw chunks, or tee delta chunks to
    the resume spool while the engine patches them; checkpoint as it goes."""

    def __init__(
        self,
        store: ObjectStore,
        book: ResumeBook,
        state: ResumeState,
        version: Version,
        basis: ObjectReader | None,
        pipe: ChunkPipe[tuple[bytes, bool]],
        *,
        threads: int,
        checkpoint_bytes: int,
    ) -> None:
        self.store, self.book, self.state = store, book, state
        self.version, self.basis, self.pipe = version, basis, pipe
        self.threads, self.checkpoint_bytes = threads, checkpoint_bytes

    def run(self) -> StagedWrite:
        if self.state.method == RAW:
            return self._raw()
        return self._delta()

    def _raw(self) -> StagedWrite:
        s = self.state
        staged = self.store.stage_resumable(
            s.dataset,
            s.key,
            self.book.partial_path(s.dataset, s.key, s.hlc),
            offset=s.offset,
            expected_size=self.version.size,
            expected_digest=self.version.digest,
        )
        s.offset = staged.size
        unpack = ChunkDecompressor()
        checkpoints = Checkpointer(self.book, s, self.checkpoint_bytes)
        try:
            for data, packed in self.pipe:
                chunk = unpack.unpack(data, CHUNK_BYTES) if packed else data
                staged.write(chunk)
                s.received = max(s.received, staged.size)
                checkpoints.maybe(staged.size, staged.checkpoint)
            checkpoints.finish()
        except zstandard.ZstdError as exc:
            checkpoints.finish()
            staged.abort()
            raise DigestMismatchError(
                f"a compressed chunk of {s.dataset}/{s.key} was damaged in transit: {exc}"
            ) from exc
        except BaseException:
            # Cut (or cancelled): keep what is durable for the next attempt.
            with contextlib.suppress(MeridianError, OSError):
                checkpoints.finish(staged.checkpoint)
            staged.detach()
            raise
        return staged

    def _delta(self) -> StagedWrite:
        s = self.state
        if self.basis is None:
            raise InvalidInputError("a delta transfer needs the basis version")
        spool_path = self.book.partial_path(s.dataset, s.key, s.hlc)
        out_path = self.book.output_path(s.dataset, s.key, s.hlc)
        fd = os.open(spool_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            held = os.fstat(fd).st_size
            s.offset = min(s.offset, held)
            os.ftruncate(fd, s.offset)
            os.lseek(fd, s.offset, os.SEEK_SET)
            written = [s.offset]

            def sync() -> int:
                covered = written[0]
                os.fsync(fd)
                return covered

            checkpoints = Checkpointer(self.book, s, self.checkpoint_bytes)

            def tee() -> Iterator[bytes]:
                done = 0
                while done < s.offset:  # what an earlier attempt received
                    piece = os.pread(fd, min(CHUNK_BYTES, s.offset - done), done)
                    if not piece:
                        break
                    done += len(piece)
                    yield piece
                for data, _ in self.pipe:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    written[0] += len(data)
                    s.received = max(s.received, written[0])
                    checkpoints.maybe(written[0], sync)
                    yield data

            old = _file(self.basis)
            try:
                native.patch(
                    old,
                    tee(),
                    str(out_path),
                    threads=self.threads,
                    max_output_size=self.version.size,
                )
            except (native.CorruptDeltaError, native.WrongBasisError) as exc:
                checkpoints.finish()
                self.book.drop(s.dataset, s.key, s.hlc)
                raise DigestMismatchError(
                    f"the delta of {s.dataset}/{s.key} failed its checks: {exc}; nothing was stored"
                ) from exc
            except BaseException:
                with contextlib.suppress(OSError, MeridianError):
                    checkpoints.finish(sync)
                raise
            finally:
                checkpoints.finish()  # idempotent after the above
                old.close()
        finally:
            os.close(fd)
        return self.store.stage_resumable(
            s.dataset,
            s.key,
            out_path,
            offset=self.version.size,
            expected_size=self.version.size,
            expected_digest=self.version.digest,
        )


async def pull(
    store: ObjectStore,
    book: ResumeBook,
    source: Source,
    dataset: str,
    key: str,
    version: Version,
    *,
    region: str,
    metrics: AgentMetrics,
    policy: PolicySource,
    set_id: str | None = None,
    policy_revision: int | None = None,
    threads: int = 2,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
    deadline_s: float = DEFAULT_DEADLINE_S,
    admit: Callable[[], object] | None = None,
) -> PullResult:
    """Receive `version` of dataset/key from the agent at `source` and commit it by
    LWW. Raises the sender's refusal as its Meridian error; a cut stream raises a
    retriable UnavailableError and leaves a resume state for the next attempt.
    `admit` is asked again just before the commit (a residency narrowed during a long
    pull refuses it then: `RefusedError`, the partial dropped, recorded `refused`)."""
    with book.in_flight(dataset, key, version.hlc.text):  # a sweep spares its files
        return await _pull(
            store,
            book,
            source,
            dataset,
            key,
            version,
            region=region,
            metrics=metrics,
            policy=policy,
            set_id=set_id,
            policy_revision=policy_revision,
            threads=threads,
            checkpoint_bytes=checkpoint_bytes,
            deadline_s=deadline_s,
            admit=admit,
        )


async def _pull(
    store: ObjectStore,
    book: ResumeBook,
    source: Source,
    dataset: str,
    key: str,
    version: Version,
    *,
    region: str,
    metrics: AgentMetrics,
    policy: PolicySource,
    set_id: str | None,
    policy_revision: int | None,
    threads: int,
    checkpoint_bytes: int,
    deadline_s: float,
    admit: Callable[[], object] | None,
) -> PullResult:
    hlc = version.hlc.text
    state = await asyncio.to_thread(book.load, dataset, key, hlc)
    held = await asyncio.to_thread(pick_basis, store, dataset, key, version)
    if (
        state is not None
        and state.method != RAW
        and (held is None or held.version.hlc.text != state.basis_hlc)
    ):
        await asyncio.to_thread(book.drop, dataset, key, hlc)
        state = None
    if state is not None:
        # Resume from what the partial file holds, not only from what its state says:
        # asking the sender for bytes after a shorter file would leave a gap that only
        # the digest at the end finds, after the whole rest was sent for nothing.
        kept = await asyncio.to_thread(_size_of, book.partial_path(dataset, key, hlc))
        if kept < state.offset:
            log.warning(
                "resume_partial_short", dataset=dataset, key=key, state=state.offset, file=kept
            )
            state.offset = kept
    tally = TransferTally(
        state.transfer_id if state else "",
        dataset,
        key,
        source.region,
        region,
        "in",
        logical_bytes=version.size,
        policy_revision=policy_revision,
    )
    start = agent_pb2.SyncStart(dataset=dataset, key=key, version=hlc, receiver_region=region)
    # A raw attempt to resume names no basis, so the sender stays with raw.
    if (
        held is not None
        and held.version.digest is not None
        and (state is None or state.method != RAW)
    ):
        start.basis.CopyFrom(
            agent_pb2.Basis(version=held.version.hlc.text, digest=held.version.digest.text)
        )
    if state is not None:
        start.resume.CopyFrom(
            agent_pb2.Resume(
                transfer_id=state.transfer_id, delta_offset=state.offset, method=state.method
            )
        )
    outcome: Outcome = "failed"
    try:
        # The whole version is written here (a raw resume: what it still lacks), before
        # any byte is asked for: refused at once (retriable) when the disk cannot take it.
        await asyncio.to_thread(
            check_room,
            store.root,
            f"a copy of {dataset}/{key} at {hlc} from {source.region}",
            version.size - (state.offset if state is not None and state.method == RAW else 0),
            NoRoomError,
        )
        async with grpc.aio.insecure_channel(source.address, options=CHANNEL_OPTIONS) as channel:
            call = agent_pb2_grpc.AgentStub(channel).Sync(timeout=deadline_s)
            try:
                result = await _attempt(
                    call,
                    start,
                    store,
                    book,
                    state,
                    version,
                    held,
                    tally,
                    set_id=set_id,
                    threads=threads,
                    checkpoint_bytes=checkpoint_bytes,
                    policy=policy,
                    admit=admit,
                )
            except grpc.aio.AioRpcError as err:
                raise from_rpc_error(err, source.address) from None
            finally:
                call.cancel()
        outcome = "completed"
        return PullResult(result, tally)
    except _RefusedHere as here:
        # This region refused it at the commit: recorded refused, as a refusal at the
        # start is, and no byte of it kept.
        await asyncio.to_thread(book.drop, dataset, key, hlc)
        tally.method = "refused"
        with contextlib.suppress(MeridianError):
            await asyncio.to_thread(
                store.record_transfer,
                dataset,
                key,
                hlc,
                tally.record("refused", policy, str(here.refusal)),
            )
        outcome = "refused"
        raise here.refusal from None
    except ResidencyError:
        # The sender refused (and recorded it): no byte of a copy this region may not
        # hold stays here, not even a partial one kept for a resume.
        await asyncio.to_thread(book.drop, dataset, key, hlc)
        raise
    except MeridianError as exc:
        if not exc.retriable and not isinstance(exc, NotFoundError):
            # Damaged or refused, not cut: what this attempt kept must not be resumed.
            # (NOT_FOUND: that source holds no such version, and sent nothing; a partial
            # another source built stays for the next one.)
            await asyncio.to_thread(book.drop, dataset, key, hlc)
        with contextlib.suppress(MeridianError):
            await asyncio.to_thread(
                store.record_transfer, dataset, key, hlc, tally.record("failed", policy, str(exc))
            )
        raise
    finally:
        tally.count(metrics, outcome)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class _RefusedHere(Exception):  # noqa: N818 - not an error of its own: it carries one
    """`admit` refused the commit: the refusal, recorded once by `_pull`."""

    def __init__(self, refusal: MeridianError) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


async def _attempt(
    call: grpc.aio.StreamStreamCall[agent_pb2.SyncRequest, agent_pb2.SyncResponse],
    start: agent_pb2.SyncStart,
    store: ObjectStore,
    book: ResumeBook,
    state: ResumeState | None,
    version: Version,
    held: StoredVersion | None,
    tally: TransferTally,
    *,
    set_id: str | None,
    threads: int,
    checkpoint_bytes: int,
    policy: PolicySource,
    admit: Callable[[], object] | None = None,
) -> ApplyResult:
    dataset, key, hlc = start.dataset, start.key, start.version
    await call.write(agent_pb2.SyncRequest(start=start))
    first = await call.read()
    if not isinstance(first, agent_pb2.SyncResponse) or first.WhichOneof("frame") != "accepted":
        raise UnavailableError(f"the sender of {dataset}/{key} ended the Sync before accepting it")
    accepted = first.accepted
    offered = version_from_wire(accepted.version, "SyncAccepted.version")
    if offered != version:
        raise InvalidInputError(
            f"the sender offered {offered} of {dataset}/{key}, not the wanted {version}"
        )
    method = accepted.method or RAW
    if method not in (RAW, BASIS, SIGNATURE):
        raise InvalidInputError(f"SyncAccepted.method {method!r} is not raw, basis or signature")
    resumed = (
        state is not None
        and state.method == method
        and accepted.delta_offset == state.offset
        and state.offset > 0
    )
    if state is not None and not resumed:
        await asyncio.to_thread(book.drop, dataset, key, hlc)
        state = None
    if state is None:
        state = ResumeState(
            transfer_id=accepted.transfer_id,
            dataset=dataset,
            key=key,
            hlc=hlc,
            method=method,
            basis_hlc=held.version.hlc.text if (held is not None and method != RAW) else "",
            offset=0,
            received=0,
            created_s=time.time(),
        )
    else:
        tally.resumed_from = state.offset
        tally.resent_bytes = max(0, state.received - state.offset)
    tally.transfer_id, tally.method = accepted.transfer_id, method
    basis: ObjectReader | None = None
    if method != RAW:
        if held is None:
            raise InvalidInputError(f"the sender chose a delta of {dataset}/{key} without a basis")
        basis = await asyncio.to_thread(store.open, dataset, key, held.version.hlc)
    try:
        if accepted.need_basis_signature:
            if basis is None:
                raise InvalidInputError("the sender asked for a basis signature of no basis")
            tally.wire_bytes += await _send_signature(call, store, basis, threads)
        pipe: ChunkPipe[tuple[bytes, bool]] = ChunkPipe()
        receiving = _Receiving(
            store,
            book,
            state,
            version,
            basis,
            pipe,
            threads=threads,
            checkpoint_bytes=checkpoint_bytes,
        )
        consumer: asyncio.Future[object] = asyncio.ensure_future(asyncio.to_thread(receiving.run))
        try:
            while True:
                response = await call.read()
                if not isinstance(response, agent_pb2.SyncResponse):
                    raise UnavailableError(
                        f"the Sync of {dataset}/{key} ended before its end frame"
                    )
                kind = response.WhichOneof("frame")
                if kind == "end":
                    break
                if kind == "delta":
                    item = (response.delta, False)
                elif kind == "content":
                    item = (response.content, False)
                elif kind == "content_zstd":
                    item = (response.content_zstd, True)
                else:
                    raise InvalidInputError(f"a Sync sent {kind} in the middle of its stream")
                tally.wire_bytes += len(item[0])
                if not await pipe.put(item, consumer):
                    break
            pipe.close()
            staged = await consumer
        except BaseException as exc:
            pipe.fail(exc if isinstance(exc, MeridianError) else PipeAbandonedError(str(exc)))
            with contextlib.suppress(BaseException):
                await consumer
            raise
        if not isinstance(staged, StagedWrite):
            raise InvalidInputError("the receiving thread returned no staged write")
        if admit is not None:
            try:
                admit()  # still allowed here? (a residency narrowed during the pull)
            except MeridianError as exc:  # refused, or not decidable (no policy)
                await asyncio.to_thread(staged.abort)
                raise _RefusedHere(exc) from exc
            except BaseException:
                await asyncio.to_thread(staged.abort)
                raise
        record = tally.record("completed", policy)
        # Held to its end when the caller is cancelled: its per-version lock must not be
        # let go (and a second pull resume the same partial file) while this commits.
        result = await run_to_the_end(
            functools.partial(store.commit_apply, staged, version, set_id=set_id, transfer=record)
        )
        if not result.verdict.applies and not result.restored:
            await asyncio.to_thread(
                store.record_transfer,
                dataset,
                key,
                hlc,
                tally.record("skipped", policy, result.verdict.value),
            )
        await asyncio.to_thread(book.drop, dataset, key, hlc)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.write(
                agent_pb2.SyncRequest(done=agent_pb2.SyncDone(transfer_id=accepted.transfer_id))
            )
            await call.done_writing()
        return result
    finally:
        if basis is not None:
            basis.close()


async def _send_signature(
    call: grpc.aio.StreamStreamCall[agent_pb2.SyncRequest, agent_pb2.SyncResponse],
    store: ObjectStore,
    basis: ObjectReader,
    threads: int,
) -> int:
    fd, path = tempfile.mkstemp(prefix="sig-", suffix=".part", dir=store.root / TMP)
    os.close(fd)
    sent = 0
    try:
        old = _file(basis)
        try:
            await asyncio.to_thread(native.signature, old, path, threads=threads)
        finally:
            old.close()
        async for chunk in file_chunks(path, CHUNK_BYTES):
            await call.write(agent_pb2.SyncRequest(basis_signature=chunk))
            sent += len(chunk)
        await call.write(agent_pb2.SyncRequest(basis_signature_end=True))
    finally:
        await remove(path)
    return sent
