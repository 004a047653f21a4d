"""Delta pushes of critical writes (issue 13): the owner pushes a new version to a
replica as a delta (native engine format) against a version the replica holds, the
replica patches it as the frames arrive, verifies and commits as for a whole push.

Why a push and not a pull (the replica running `Sync` against the owner): a pull
costs the replica's request and the sender's answer before the first delta byte,
so an acked write would take two round trips instead of one; the owner has both
files at hand (the new version and its basis), so it diffs with no signature on the
wire. What it cannot know for sure is which version the replica still holds: it
names its guess in the header (`ReplicateHeader.basis`: the version it last pushed
there and saw committed, else its own previous version, which a replica in step
holds), and a replica without it answers `basis_missing` at once, before any frame
is read; the owner then pushes whole. So a miss costs one round trip, a hit none.

When it pays: objects of at least `DELTA_MIN_BYTES` (below, the frames of a whole
push cost about what the delta would) over a basis of a comparable size.

The transfer record of the replica says `method: push-delta` and carries the delta's
bytes as `wire_bytes` beside the version's size as `logical_bytes`, so the catalog's
transfers show what a full copy would have sent beside what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import native
from agents.store import ObjectReader, ObjectStore, StagedWrite
from agents.store.errors import DigestMismatchError
from agents.store.staging import TMP
from agents.to_the_end import open_in_thread
from agents.transfer.bridge import ChunkPipe, iterate_in_thread
from agents.transfer.limiter import CHUNK_BYTES
from agents.transfer.sender import coalesce
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, MeridianError
from meridian.v1 import agent_pb2

DELTA_MIN_BYTES = 64 * 1024
PUSH, PUSH_DELTA = "push", "push-delta"
_KNOWN_MAX = 100_000  # (region, dataset, key) entries remembered, least recent dropped


class ReplicaBases:
    """What the owner last saw each replica commit of each object, or that it lacked
    the basis it was offered (bounded, in memory: a restarted owner guesses its own
    previous version instead)."""

    def __init__(self, limit: int = _KNOWN_MAX) -> None:
        # None: the replica answered basis_missing and has committed nothing since.
        self._known: OrderedDict[tuple[str, str, str], Version | None] = OrderedDict()
        self._limit = limit

    def committed(self, region: str, dataset: str, key: str, version: Version) -> None:
        self._remember((region, dataset, key), version)

    def basis_missing(self, region: str, dataset: str, key: str) -> None:
        """The replica lacked the basis offered: push the object whole there until it
        is seen to commit a version (a retry of the same push, offered the same
        guess, would only pay the refusal's round trip again)."""
        self._remember((region, dataset, key), None)

    def _remember(self, name: tuple[str, str, str], version: Version | None) -> None:
        self._known[name] = version
        self._known.move_to_end(name)
        while len(self._known) > self._limit:
            self._known.popitem(last=False)

    def forget(self, region: str, dataset: str, key: str) -> None:
        self._known.pop((region, dataset, key), None)

    def get(self, region: str, dataset: str, key: str) -> Version | None:
        return self._known.get((region, dataset, key))

    def lacks_basis(self, region: str, dataset: str, key: str) -> bool:
        name = (region, dataset, key)
        return name in self._known and self._known[name] is None


def choose_basis(
    store: ObjectStore, dataset: str, key: str, version: Version, known: Version | None
) -> Version | None:
    """The version to diff `version` against for one replica, or None to push whole:
    the one the replica was last seen to commit if this store still holds it, else
    this store's newest put before `version`; only when a delta pays."""
    if version.is_tombstone or version.size < DELTA_MIN_BYTES:
        return None
    held = {
        s.version.hlc: s
        for s in store.versions(dataset, key)
        if not s.version.is_tombstone and s.state == "present" and s.version.hlc < version.hlc
    }
    pick = None
    if known is not None and known.hlc in held:
        pick = held[known.hlc].version
    elif held:
        pick = held[max(held)].version
    if pick is None or pick.digest is None or pick.size * 4 < version.size:
        return None  # nothing to diff against, or a basis too small to help much
    return pick


def _second_fd(reader: ObjectReader) -> io.FileIO:
    # A descriptor of its own at offset 0 for the engine; the reader keeps its own.
    return io.FileIO(os.open(f"/proc/self/fd/{reader.fileno()}", os.O_RDONLY), "rb")


def delta_frames(
    store: ObjectStore, dataset: str, key: str, version: Version, basis: Version, *, threads: int
) -> AsyncIterator[bytes]:
    """The delta from `basis` to `version` (both held here) in chunks of at most 1 MiB,
    made on a thread while they are sent."""

    def make() -> Iterator[bytes]:
        old = store.open(dataset, key, basis.hlc)
        new = store.open(dataset, key, version.hlc)
        try:
            with _second_fd(old) as old_fd, _second_fd(new) as new_fd:
                pieces = native.delta_chunks(old_fd, new_fd, basis=True, threads=threads)
                try:
                    yield from coalesce(pieces, 0, CHUNK_BYTES)
                finally:
                    close = getattr(pieces, "close", None)
                    if callable(close):
                        close()  # before the files it reads: closing cancels the engine
        finally:
            old.close()
            new.close()

    return iterate_in_thread(make)


def holds_basis(store: ObjectStore, header: agent_pb2.ReplicateHeader) -> bool:
    """Whether this replica holds the basis a delta push names, bytes and digest."""
    with contextlib.suppress(MeridianError):
        held = store.stat(header.dataset, header.key, header.basis.version)
        digest = held.version.digest
        return held.state == "present" and digest is not None and digest.text == header.basis.digest
    return False


async def receive_delta(
    store: ObjectStore,
    header: agent_pb2.ReplicateHeader,
    version: Version,
    frames: AsyncIterator[agent_pb2.ReplicateRequest],
    *,
    threads: int,
) -> tuple[StagedWrite, int]:
    """Patch the pushed delta frames over the named basis into a staged write of
    `version` (size and digest checked by the store at its commit); returns it with
    the delta's bytes. A damaged delta or one over another basis is DATA_LOSS; nothing
    is stored either way until the caller commits."""
    dataset, key = header.dataset, header.key
    basis = await open_in_thread(functools.partial(store.open, dataset, key, header.basis.version))
    try:
        fd, raw_path = tempfile.mkstemp(prefix="push-", suffix=".part", dir=store.root / TMP)
    except BaseException:  # a full disk, say: the basis is not left open
        basis.close()
        raise
    os.close(fd)
    out_path = Path(raw_path)
    pipe: ChunkPipe[bytes] = ChunkPipe()
    received = 0
    try:

        def run() -> None:
            with _second_fd(basis) as old:
                native.patch(old, iter(pipe), str(out_path), max_output_size=version.size)

        patching: asyncio.Future[object] = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            async for request in frames:
                if request.WhichOneof("frame") != "delta":
                    raise InvalidInputError(
                        "ReplicateRequest: a push that names a basis carries delta frames only"
                    )
                received += len(request.delta)
                if not await pipe.put(request.delta, patching):
                    break  # the engine stopped early: its error says why
            pipe.close()
            await patching
        except BaseException:
            pipe.abandon()
            with contextlib.suppress(BaseException):
                await patching
            raise
    except (native.CorruptDeltaError, native.WrongBasisError, native.TruncatedDeltaError) as exc:
        await asyncio.to_thread(_unlink, out_path)
        raise DigestMismatchError(
            f"the delta pushed for {dataset}/{key} at {version.hlc} failed its checks: {exc}; "
            "nothing was stored"
        ) from exc
    except BaseException:
        await asyncio.to_thread(_unlink, out_path)
        raise
    finally:
        basis.close()
    staged = await asyncio.to_thread(
        store.stage_resumable,
        dataset,
        key,
        out_path,
        offset=version.size,
        expected_size=version.size,
        expected_digest=version.digest,
    )
    return staged, received


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
