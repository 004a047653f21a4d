"""Bundles: many small versions going the same way travel in one stream (SyncBundle)
rather than one call each (spec/dataplane.md, *Transfers*: objects below
`bundle_max_bytes`).

Wire form (additive to agent.proto): the receiver names the items (dataset, key,
version) and its region; the sender answers, per item in order, a BundleItemStart
(or the item's refusal: residency, not held) and then its content in chunks of at
most 1 MiB, each zstd-compressed on its own when that is smaller and the dataset's
policy asks for it. The receiver stages the items as they arrive and commits them in
batches with `apply_many` (one transaction and one parallel fsync round per batch,
each batch recorded as one transfer), committing batch n while batch n+1 arrives.
A batch is cut at BATCH_ITEMS / BATCH_BYTES, or earlier, at a frame's end, once it
holds EAGER_BYTES and no commit is running: batches then shrink toward what arrives
during one commit, so the last one, committed after the stream ends, is small. With
fixed-size batches the stream's end waited for a whole batch to commit (and with
several bundles ending together on one link, for one whole batch of each). One commit
at a time, not two: each ends in a syncfs, which flushes the whole file system, so
overlapping commits flush each other's files and none ends sooner. (Tried: with two,
5 of 6 runs of the 10,000 files took 8.4-11 s on the loaded test machine, 3.6-4.3 s for
7 runs with one; a later run with one also took 9.2 s, so the file system's load, not
only the overlap, made those slow: kept at one for the syncfs reason.)
A damaged item fails its batch (apply_many is all or nothing); the caller fetches
that batch's items one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from agents.errors import ResidencyError
from agents.metrics import AgentMetrics
from agents.rpc.status import from_rpc_error
from agents.store import ApplyResult, ObjectStore
from agents.store.errors import DigestMismatchError
from agents.transfer.bridge import iterate_in_thread
from agents.transfer.compress import ChunkCompressor, ChunkDecompressor
from agents.transfer.limiter import CHUNK_BYTES, LinkLimiter
from agents.transfer.ports import AdmissionPort, PolicySource
from agents.transfer.pull import CHANNEL_OPTIONS, DEFAULT_DEADLINE_S, Source
from agents.transfer.records import TransferTally, new_transfer_id
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError, UnavailableError
from controlplane.logs import get_logger
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

log = get_logger(__name__)

BUNDLE_MAX_BYTES = 1 << 20  # objects below this size travel in bundles
PACK_BYTES = 256 << 10  # a packed frame's content (and the largest item packed)
READ_BLOCK_ITEMS = 500  # the sender reads a bundle's items in blocks (one lookup each)
READ_BLOCK_BYTES = 8 << 20
FIRST_BLOCK_ITEMS = 32
# A bundle's first packed frame is small and each next one as large as all before it,
# up to PACK_BYTES: the first bytes leave once 8 items are read, not 64 (the receiver
# starts on its first batch sooner too), and the frames still end at 1 MiB (256 items
# of 4 KiB), where the receiver cuts its first batch.
FIRST_PACK_BYTES = 32 << 10
BATCH_ITEMS = 1000
BATCH_BYTES = 16 << 20
# The least an early batch carries: below about 1 MiB the fixed cost of a batch (its
# transaction, syncfs and transfer record) made the receiver's CPU grow 1.5-2x.
EAGER_BYTES = 1 << 20
MAX_ITEMS = 100_000


@dataclass(frozen=True)
class Wanted:
    dataset: str
    key: str
    version: Version
    # The version as it came on the wire (a FetchRequest's), when at hand: the bundle's
    # request then copies it instead of encoding `version` again.
    wire: types_pb2.Version | None = None


class BundleSender:
    """The sending side of SyncBundle."""

    def __init__(
        self,
        store: ObjectStore,
        admission: AdmissionPort,
        region: str,
        metrics: AgentMetrics,
        limiter: LinkLimiter,
        policy: PolicySource,
    ) -> None:
        self.store, self.admission, self.region = store, admission, region
        self.metrics, self.limiter, self.policy = metrics, limiter, policy

    async def serve(
        self, request: agent_pb2.SyncBundleRequest
    ) -> AsyncIterator[agent_pb2.SyncBundleResponse]:
        if not request.receiver_region:
            raise InvalidInputError("SyncBundleRequest.receiver_region: the receiver must name it")
        if len(request.items) > MAX_ITEMS:
            raise InvalidInputError(
                f"SyncBundleRequest.items: at most {MAX_ITEMS} items per bundle, got "
                f"{len(request.items)}"
            )
        to = request.receiver_region
        tally = TransferTally(new_transfer_id(), "", "", self.region, to, "out", method="bundle")
        outcome = "failed"
        try:
            async for frame, placement, n in iterate_in_thread(lambda: self._frames(request)):
                if n and placement is not None:
                    await self.limiter.acquire(
                        self.region,
                        to,
                        n,
                        placement.transfer_bandwidth_bps,
                        critical=placement.dataset_class == "critical",
                    )
                tally.wire_bytes += n
                yield frame
            outcome = "completed"
        finally:
            tally.count(self.metrics, "completed" if outcome == "completed" else "failed")

    def _frames(
        self, request: agent_pb2.SyncBundleRequest
    ) -> Iterator[tuple[agent_pb2.SyncBundleResponse, Placement | None, int]]:
        """On a thread: admit, read and compress each item. Yields each frame with the
        placement its content is charged to and its content's size."""
        to = request.receiver_region
        placements: dict[str, Placement | MeridianError] = {}
        packers: dict[str, ChunkCompressor] = {}
        # Packed: whole small items gather in one frame of up to PACK_BYTES, all of one
        # placement (the limiter charges the frame to it). The entries are added to the
        # frame in place (building each one apart and then the frame copied them all).
        pack = agent_pb2.SyncBundleResponse()
        entries = pack.pack.entries
        pack_bytes = 0
        pack_limit = FIRST_PACK_BYTES
        packed_total = 0
        pack_placement: Placement | None = None

        def flush() -> Iterator[tuple[agent_pb2.SyncBundleResponse, Placement | None, int]]:
            nonlocal pack, entries, pack_bytes, pack_placement, pack_limit, packed_total
            if entries:
                yield pack, pack_placement, pack_bytes
                pack = agent_pb2.SyncBundleResponse()
                entries = pack.pack.entries
                packed_total += pack_bytes
                pack_limit = min(PACK_BYTES, max(pack_limit, packed_total))
            pack_bytes, pack_placement = 0, None

        block: dict[int, bytes | MeridianError] = {}
        # Each item's version, parsed once: the block read parses ahead of the loop.
        versions: dict[int, Version] = {}
        # The first block is small and each next one twice the size, so the first frame
        # leaves after a few reads rather than a whole block's (about 0.1 s of 500 reads,
        # paid by every bundle before its first byte moved).
        block_items = FIRST_BLOCK_ITEMS
        for index, item in enumerate(request.items):
            try:
                version = versions.pop(index, None) or version_from_wire(
                    item.version, f"SyncBundleRequest.items[{index}].version"
                )
                if item.dataset not in placements:
                    try:
                        placements[item.dataset] = self.admission.admit_send(item.dataset, to)
                    except ResidencyError as exc:
                        placements[item.dataset] = exc
                        self._refused(item.dataset, item.key, version, to, exc)
                found = placements[item.dataset]
                if isinstance(found, MeridianError):
                    raise found
                placement = found
                if index not in block:
                    block = self._read_block(request.items, index, block_items, versions)
                    block_items = min(READ_BLOCK_ITEMS, 2 * block_items)
                got = block.pop(index, None)
                if got is None:  # not in the block (a repeated object): alone
                    with self.store.open(item.dataset, item.key, version.hlc) as reader:
                        got = reader.read_all()
                if isinstance(got, MeridianError):
                    raise got
                data = got
            except MeridianError as exc:
                code = (
                    "PERMISSION_DENIED"
                    if isinstance(exc, ResidencyError)
                    else ("NOT_FOUND" if isinstance(exc, NotFoundError) else "UNAVAILABLE")
                )
                start = agent_pb2.BundleItemStart(index=index, refused=str(exc), refused_code=code)
                if request.packed:
                    entries.add(item=start)
                else:
                    yield agent_pb2.SyncBundleResponse(item=start), None, 0
                continue
            packer = packers.get(item.dataset)
            if packer is None:  # one per dataset (each holds a zstd context)
                packer = packers[item.dataset] = ChunkCompressor(
                    placement.transfer_compression == "zstd"
                )
            if request.packed and len(data) < PACK_BYTES:
                packed, compressed = packer.pack(data)
                if pack_bytes + len(packed) > pack_limit or pack_placement not in (
                    None,
                    placement,
                ):
                    yield from flush()
                entry = entries.add(content=packed, zstd=compressed)
                entry.item.index = index
                pack_bytes += len(packed)
                pack_placement = placement
                continue
            yield from flush()
            start = agent_pb2.BundleItemStart(index=index)
            yield agent_pb2.SyncBundleResponse(item=start), None, 0
            for at in range(0, len(data), CHUNK_BYTES):
                packed, compressed = packer.pack(data[at : at + CHUNK_BYTES])
                frame = (
                    agent_pb2.SyncBundleResponse(content_zstd=packed)
                    if compressed
                    else agent_pb2.SyncBundleResponse(content=packed)
                )
                yield frame, placement, len(packed)
        yield from flush()

    def _read_block(
        self,
        items: Sequence[agent_pb2.BundleItem],
        start: int,
        count: int = READ_BLOCK_ITEMS,
        versions: dict[int, Version] | None = None,
    ) -> dict[int, bytes | MeridianError]:
        """The contents of the items from `start` on, up to `count` items or
        READ_BLOCK_BYTES, read with one store lookup (`open_many`) instead of one per
        item; by index, the bytes or the error `open` gives. Items it cannot take (a bad
        version, an object twice) are left out: the caller reads those alone. The
        versions it parses go in `versions` (by index), for the caller to reuse."""
        chosen: list[tuple[int, agent_pb2.BundleItem, Version]] = []
        seen: set[tuple[str, str]] = set()
        size = 0
        for index in range(start, min(len(items), start + count)):
            item = items[index]
            try:
                version = version_from_wire(item.version, "")
            except MeridianError:
                continue
            if versions is not None:
                versions[index] = version
            if (item.dataset, item.key) in seen:
                continue
            seen.add((item.dataset, item.key))
            chosen.append((index, item, version))
            size += version.size
            if size >= READ_BLOCK_BYTES:
                break
        try:
            readers = self.store.open_many([(i.dataset, i.key, v.hlc) for _, i, v in chosen])
        except MeridianError:
            return {}  # a bad name: each item alone gives its own error
        out: dict[int, bytes | MeridianError] = {}
        for (index, _, _), reader in zip(chosen, readers, strict=True):
            if isinstance(reader, MeridianError):
                out[index] = reader
                continue
            with reader:
                out[index] = reader.read_all()
        return out

    def _refused(
        self, dataset: str, key: str, version: Version, to: str, exc: ResidencyError
    ) -> None:
        tally = TransferTally(new_transfer_id(), dataset, key, self.region, to, "out", "refused")
        with contextlib.suppress(MeridianError):
            self.store.record_transfer(
                dataset, key, version.hlc.text, tally.record("refused", self.policy, str(exc))
            )
        tally.count(self.metrics, "refused")


@dataclass
class _Item:
    index: int
    chunks: list[tuple[bytes, bool]] = field(default_factory=list)
    size: int = 0


async def pull_bundle(
    store: ObjectStore,
    source: Source,
    items: Sequence[Wanted],
    *,
    region: str,
    metrics: AgentMetrics,
    policy: PolicySource,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> list[ApplyResult | MeridianError]:
    """Receive `items` from `source` in one SyncBundle and commit them in batches.
    Returns, per item in order, its ApplyResult or the error that kept it out (a
    refusal by the sender, a failed batch, a cut stream)."""
    results: list[ApplyResult | MeridianError | None] = [None] * len(items)
    request = agent_pb2.SyncBundleRequest(
        items=[
            agent_pb2.BundleItem(
                dataset=w.dataset,
                key=w.key,
                version=version_to_wire(w.version) if w.wire is None else w.wire,
            )
            for w in items
        ],
        receiver_region=region,
        packed=True,
    )
    commits: list[asyncio.Task[None]] = []
    batch: list[_Item] = []
    batch_bytes = 0
    wire = [0]

    def commit(done: list[_Item], wire_bytes: int) -> None:
        tally = TransferTally(
            new_transfer_id(),
            items[done[0].index].dataset,
            f"{len(done)} objects",
            source.region,
            region,
            "in",
            method="bundle",
            logical_bytes=sum(i.size for i in done),
            wire_bytes=wire_bytes,
        )
        unpack = ChunkDecompressor()
        try:
            entries = []
            for it in done:
                w = items[it.index]
                data = b"".join(
                    unpack.unpack(c, CHUNK_BYTES) if packed else c for c, packed in it.chunks
                )
                entries.append((w.dataset, w.key, w.version, [data]))
            record = tally.record("completed", policy)
            record["items"] = len(done)
            applied = store.apply_many(entries, transfer=record)
            for it, result in zip(done, applied, strict=True):
                results[it.index] = result
            tally.count(metrics, "completed")
        except Exception as exc:  # noqa: BLE001 - the batch's items get the error
            error = (
                exc
                if isinstance(exc, MeridianError)
                else DigestMismatchError(f"a bundle item was damaged in transit: {exc}")
            )
            for it in done:
                results[it.index] = error
            with contextlib.suppress(MeridianError):
                store.record_transfer(
                    tally.dataset, None, None, tally.record("failed", policy, str(error))
                )
            tally.count(metrics, "failed")

    def idle() -> bool:
        return all(task.done() for task in commits)

    async def flush() -> None:
        nonlocal batch, batch_bytes
        if batch:
            done, batch, batch_bytes = batch, [], 0
            wire_bytes, wire[0] = wire[0], 0
            if len(commits) >= 2:  # at most two batches committing while more arrive
                await commits.pop(0)
            commits.append(asyncio.ensure_future(asyncio.to_thread(commit, done, wire_bytes)))

    current: _Item | None = None
    try:
        async with grpc.aio.insecure_channel(source.address, options=CHANNEL_OPTIONS) as channel:
            call = agent_pb2_grpc.AgentStub(channel).SyncBundle(request, timeout=deadline_s)
            try:
                async for response in call:
                    kind = response.WhichOneof("frame")
                    if kind == "item":
                        start = response.item
                        if current is not None:
                            batch.append(current)
                            current = None
                        if batch and (len(batch) >= BATCH_ITEMS or batch_bytes >= BATCH_BYTES):
                            await flush()
                        if not 0 <= start.index < len(items):
                            raise InvalidInputError(f"a bundle named item {start.index}")
                        if start.refused:
                            results[start.index] = _refusal(start.refused_code, start.refused)
                            continue
                        current = _Item(start.index)
                    elif kind == "pack":
                        if current is not None:
                            batch.append(current)
                            current = None
                        for entry in response.pack.entries:
                            if len(batch) >= BATCH_ITEMS or batch_bytes >= BATCH_BYTES:
                                await flush()
                            start = entry.item
                            if not 0 <= start.index < len(items):
                                raise InvalidInputError(f"a bundle named item {start.index}")
                            if start.refused:
                                results[start.index] = _refusal(start.refused_code, start.refused)
                                continue
                            done = _Item(start.index, [(entry.content, entry.zstd)])
                            done.size = items[start.index].version.size
                            batch.append(done)
                            wire[0] += len(entry.content)
                            batch_bytes += len(entry.content)
                        if batch_bytes >= EAGER_BYTES and idle():
                            await flush()
                    elif kind in ("content", "content_zstd"):
                        if current is None:
                            raise InvalidInputError("a bundle sent content before an item")
                        data = response.content or response.content_zstd
                        current.chunks.append((data, kind == "content_zstd"))
                        current.size = items[current.index].version.size
                        wire[0] += len(data)
                        batch_bytes += len(data)
            except grpc.aio.AioRpcError as err:
                raise from_rpc_error(err, source.address) from None
        if current is not None:
            batch.append(current)
            current = None
        await flush()
    except MeridianError as exc:
        for n, result in enumerate(results):
            if result is None and all(it.index != n for it in batch):
                results[n] = exc
        for it in batch:
            results[it.index] = exc
    finally:
        for task in commits:
            await task
    return [
        r if r is not None else UnavailableError(f"the bundle from {source.region} ended early")
        for r in results
    ]


def _refusal(code: str, message: str) -> MeridianError:
    if code == "PERMISSION_DENIED":
        return ResidencyError(message)
    if code == "NOT_FOUND":
        return NotFoundError(message)
    return UnavailableError(message)
