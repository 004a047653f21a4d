"""The sending side of Sync: admits the copy (residency of the receiver's region),
picks how to make the stream (a delta with both files at hand, a delta from the
receiver's signature, or the raw content when the receiver has no basis), and
streams it through the link's bandwidth limiter.

Resume: the engine's output is deterministic (byte-identical for any thread count),
so a resumed attempt makes the same stream again and skips the `delta_offset` bytes
the receiver already holds; nothing is spooled on the sender, a restarted sender
resumes as well as a live one, and no spool needs a lifetime. The cost is sender CPU
for the skipped prefix (the engine runs at GB/s); the skipped bytes never reach the
wire. Raw content needs no regeneration: it is read from `delta_offset` on.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import native
from agents.errors import ResidencyError
from agents.metrics import AgentMetrics
from agents.store import ObjectReader, ObjectStore
from agents.store.staging import TMP
from agents.transfer.bridge import iterate_in_thread
from agents.transfer.compress import ChunkCompressor
from agents.transfer.limiter import CHUNK_BYTES, LinkLimiter
from agents.transfer.ports import AdmissionPort, PolicySource
from agents.transfer.records import TransferTally, new_transfer_id
from controlplane.domain.placement import Placement
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError
from controlplane.logs import get_logger
from meridian.convert import hlc_from_wire, version_to_wire
from meridian.v1 import agent_pb2, types_pb2

log = get_logger(__name__)

RAW, BASIS, SIGNATURE = "raw", "basis", "signature"
_COMPRESSION = {"zstd": types_pb2.COMPRESSION_ZSTD, "none": types_pb2.COMPRESSION_NONE}


@dataclass(frozen=True)
class _Plan:
    method: str
    offset: int
    transfer_id: str
    basis: ObjectReader | None


def coalesce(pieces: Iterator[bytes], skip: int, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """`pieces` (pipe reads of at most 64 KiB) regrouped into chunks of `size`, after
    dropping the first `skip` bytes (what a resuming receiver holds)."""
    buf = bytearray()
    for piece in pieces:
        data = piece
        if skip:
            if len(data) <= skip:
                skip -= len(data)
                continue
            data = data[skip:]
            skip = 0
        buf += data
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if skip:
        raise InvalidInputError(f"the resume offset lies {skip} bytes past the end of the delta")
    if buf:
        yield bytes(buf)


@contextlib.contextmanager
def _closed_after(pieces: Iterator[bytes]) -> Iterator[Iterator[bytes]]:
    """Close a generator when the block ends (delta_chunks is typed as an Iterator)."""
    try:
        yield pieces
    finally:
        close = getattr(pieces, "close", None)
        if callable(close):
            close()


def _file(reader: ObjectReader) -> io.FileIO:
    # A second descriptor at offset 0 for the engine; the reader's own stays untouched.
    return io.FileIO(os.open(f"/proc/self/fd/{reader.fileno()}", os.O_RDONLY), "rb")


class SyncSender:
    def __init__(
        self,
        store: ObjectStore,
        admission: AdmissionPort,
        region: str,
        metrics: AgentMetrics,
        limiter: LinkLimiter,
        policy: PolicySource,
        *,
        threads: int = 2,
    ) -> None:
        self.store = store
        self.admission = admission
        self.region = region
        self.metrics = metrics
        self.limiter = limiter
        self.policy = policy
        self.threads = threads

    async def serve(
        self, requests: AsyncIterator[agent_pb2.SyncRequest]
    ) -> AsyncIterator[agent_pb2.SyncResponse]:
        first = await anext(requests, None)
        if first is None or first.WhichOneof("frame") != "start":
            raise InvalidInputError("a Sync must begin with SyncStart")
        start = first.start
        if not start.receiver_region:
            raise InvalidInputError("SyncStart.receiver_region: the receiver must name its region")
        hlc = hlc_from_wire(start.version, "SyncStart.version")
        tally = TransferTally(
            new_transfer_id(), start.dataset, start.key, self.region, start.receiver_region, "out"
        )
        try:
            placement = self.admission.admit_send(start.dataset, start.receiver_region)
        except ResidencyError as exc:
            tally.method = "refused"
            await asyncio.to_thread(
                self.store.record_transfer,
                start.dataset,
                start.key,
                hlc.text,
                tally.record("refused", self.policy, str(exc)),
            )
            tally.count(self.metrics, "refused")
            raise
        reader = await asyncio.to_thread(self.store.open, start.dataset, start.key, hlc)
        plan: _Plan | None = None
        outcome = "failed"
        try:
            plan = await asyncio.to_thread(self._plan, start, reader)
            tally.transfer_id, tally.method = plan.transfer_id, plan.method
            tally.logical_bytes = reader.size
            yield agent_pb2.SyncResponse(
                accepted=agent_pb2.SyncAccepted(
                    transfer_id=plan.transfer_id,
                    version=version_to_wire(reader.version),
                    need_basis_signature=plan.method == SIGNATURE,
                    delta_offset=plan.offset,
                    compression=_COMPRESSION[placement.transfer_compression],
                    method=plan.method,
                )
            )
            sig_path: str | None = None
            try:
                if plan.method == SIGNATURE:
                    sig_path = await self._receive_signature(requests, tally)
                sent = 0
                async for frame in self._frames(reader, plan, placement, sig_path):
                    n = len(frame.delta or frame.content or frame.content_zstd)
                    await self.limiter.acquire(
                        self.region,
                        start.receiver_region,
                        n,
                        placement.transfer_bandwidth_bps,
                        critical=placement.dataset_class == "critical",
                    )
                    sent += n
                    tally.wire_bytes += n
                    yield frame
                yield agent_pb2.SyncResponse(end=agent_pb2.SyncEnd(delta_bytes=plan.offset + sent))
            finally:
                if sig_path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(sig_path)
            async for request in requests:
                if request.WhichOneof("frame") == "done":
                    outcome = "completed"
                    break
        finally:
            reader.close()
            if plan is not None and plan.basis is not None:
                plan.basis.close()
            tally.count(self.metrics, "completed" if outcome == "completed" else "failed")
            log.info(
                "sync sent",
                transfer_id=tally.transfer_id,
                dataset=tally.dataset,
                key=tally.key,
                to_region=tally.to_region,
                method=tally.method,
                wire_bytes=tally.wire_bytes,
                outcome=outcome,
            )

    def _plan(self, start: agent_pb2.SyncStart, reader: ObjectReader) -> _Plan:
        basis: ObjectReader | None = None
        if start.HasField("basis") and start.basis.version:
            with contextlib.suppress(MeridianError):
                held = self.store.stat(start.dataset, start.key, start.basis.version)
                digest = held.version.digest
                if (
                    held.state == "present"
                    and digest is not None
                    and digest.text == start.basis.digest
                ):
                    basis = self.store.open(start.dataset, start.key, start.basis.version)
        wanted = start.resume.method if start.HasField("resume") else ""
        if not start.HasField("basis") or not start.basis.version:
            method = RAW
        elif wanted == SIGNATURE or basis is None:
            method = SIGNATURE
        else:
            method = BASIS
        if method != BASIS and basis is not None:
            basis.close()
            basis = None
        if wanted and wanted == method:
            offset = start.resume.delta_offset
            if method == RAW and offset > reader.size:
                raise InvalidInputError(
                    f"Resume.delta_offset {offset} is past the {reader.size} bytes of the content"
                )
            return _Plan(method, offset, start.resume.transfer_id or new_transfer_id(), basis)
        return _Plan(method, 0, new_transfer_id(), basis)

    async def _receive_signature(
        self, requests: AsyncIterator[agent_pb2.SyncRequest], tally: TransferTally
    ) -> str:
        fd, path = tempfile.mkstemp(prefix="sig-", suffix=".part", dir=self.store.root / TMP)
        try:
            with os.fdopen(fd, "wb") as out:
                async for request in requests:
                    kind = request.WhichOneof("frame")
                    if kind == "basis_signature":
                        tally.wire_bytes += len(request.basis_signature)
                        await asyncio.to_thread(out.write, request.basis_signature)
                    elif kind == "basis_signature_end":
                        return path
                    else:
                        raise InvalidInputError(
                            f"a Sync sent {kind} before its basis signature ended"
                        )
            raise InvalidInputError("the Sync ended before its basis signature did")
        except BaseException:
            os.unlink(path)
            raise

    def _frames(
        self, reader: ObjectReader, plan: _Plan, placement: Placement, sig_path: str | None
    ) -> AsyncIterator[agent_pb2.SyncResponse]:
        if plan.method == RAW:
            return iterate_in_thread(
                lambda: self._raw(reader, plan.offset, placement.transfer_compression == "zstd")
            )
        return iterate_in_thread(lambda: self._delta(reader, plan, sig_path))

    def _raw(
        self, reader: ObjectReader, offset: int, compress: bool
    ) -> Iterator[agent_pb2.SyncResponse]:
        packer = ChunkCompressor(compress)
        fd = reader.fileno()
        while offset < reader.size:
            chunk = os.pread(fd, min(CHUNK_BYTES, reader.size - offset), offset)
            if not chunk:
                raise NotFoundError(f"version {reader.version.hlc} shrank while it was being sent")
            offset += len(chunk)
            data, packed = packer.pack(chunk)
            if packed:
                yield agent_pb2.SyncResponse(content_zstd=data)
            else:
                yield agent_pb2.SyncResponse(content=data)

    def _delta(
        self, reader: ObjectReader, plan: _Plan, sig_path: str | None
    ) -> Iterator[agent_pb2.SyncResponse]:
        new = _file(reader)
        try:
            if plan.method == BASIS:
                if plan.basis is None:
                    raise InvalidInputError("a basis delta needs the basis version")
                old = _file(plan.basis)
                try:
                    # Closed here, before the files it reads: closing cancels the engine.
                    with _closed_after(
                        native.delta_chunks(old, new, basis=True, threads=self.threads)
                    ) as pieces:
                        for chunk in coalesce(pieces, plan.offset):
                            yield agent_pb2.SyncResponse(delta=chunk)
                finally:
                    old.close()
            else:
                if sig_path is None:
                    raise InvalidInputError("a signature delta needs the receiver's signature")
                with _closed_after(
                    native.delta_chunks(sig_path, new, basis=False, threads=self.threads)
                ) as pieces:
                    for chunk in coalesce(pieces, plan.offset):
                        yield agent_pb2.SyncResponse(delta=chunk)
        finally:
            new.close()
