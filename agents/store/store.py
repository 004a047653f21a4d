"""The agent's local object store: one root folder, bytes in files, metadata in SQLite.

See agents/store/README.md for the on-disk format and the guarantees. Every
method blocks and is thread-safe: bulk bytes move outside any lock; one lock per
object (striped) orders the commits of that object; one store lock guards the
SQLite connection, whose transactions are short.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import sqlite3
import threading
import uuid
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal, NamedTuple, Self, cast

from agents.store import files, repair, rows
from agents.store.errors import (
    DeletedError,
    DigestMismatchError,
    MissingContentError,
    StorageError,
    StoreLockedError,
    TooLargeError,
)
from agents.store.group import (
    MAX_GROUP,
    GroupCommitter,
    GroupStats,
    InterruptedCommitError,
    own_copy,
)
from agents.store.model import (
    EVICTED,
    ApplyResult,
    Evicted,
    JournalEntry,
    JsonValue,
    OutboxEvent,
    Page,
    RepairReport,
    SetRecord,
    SmallPut,
    StoredVersion,
    Usage,
)
from agents.store.names import OBJECTS, check_name, version_path, version_text
from agents.store.reader import CHUNK_BYTES, InlineReader, ObjectReader
from agents.store.schema import FORMAT, connect
from agents.store.staging import HOLE_MIN_BYTES, TMP, StagedWrite, checked_bytes
from controlplane.domain.errors import ClockSkewError, HLCError
from controlplane.domain.events import MAX_EVENT_BYTES
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Verdict, Version, lww
from controlplane.errors import ConfigError, InvalidInputError, NotFoundError, UnavailableError
from controlplane.logs import get_logger

log = get_logger(__name__)

DEFAULT_KEEP_VERSIONS = 2
DEFAULT_TOMBSTONE_RETENTION_S = 7 * 24 * 3600
MAX_PAGE = 10_000
# Object locks, striped: a writer holds its object's stripe until its commit is durable,
# so with group commit two writers of different objects on one stripe cannot share a
# group; 4,096 stripes make that rare among hundreds of writers.
_STRIPES = 4096
RECORDER = "recorder"
_FSYNC_THREADS = 16
# A bundle of at least this many files is made durable by one syncfs(2) of the store's
# file system, not one fsync per file and folder.
SYNCFS_MIN_FILES = 32
# An applied put of at most this many bytes, all at hand (an inline change event's), is
# kept in the metadata database (`inline_bytes`, schema.py) rather than in a file: for
# small objects the file's create, rename and sync were most of the agent's CPU per
# replicated object, and SQLite reads and writes blobs of this size faster than the file
# system does (sqlite.org, "Internal Versus External BLOBs": up to ~100 KB).
INLINE_MAX_BYTES = 64 * 1024
# Objects a tombstone expiry reads per look (each under the store's lock).
EXPIRY_BATCH = 1000
# Candidates of one dataset an expiry's `confirm` is asked about at once.
CONFIRM_BATCH = 32


@dataclass(frozen=True)
class _Entry:
    """One version to install (see `_install_many`)."""

    dataset: str
    key: str
    version: Version
    staged: StagedWrite | None
    set_id: str | None = None
    outbox: bool = False
    epoch: int = 0
    policy_revision: int | None = None
    transfer: Mapping[str, JsonValue] | None = None  # journalled with this version
    inline: bytes | None = None  # a put's bytes kept in `inline_bytes` (then no staged file)

    @functools.cached_property
    def where(self) -> tuple[str, str]:
        """Its fan-out folder's name and its version's path (relative to the root, as
        text), computed once: a bundle needs them for the folder, the rename and the
        row, and they are a blake3 and a string build."""
        return version_text(self.dataset, self.key, self.version.hlc)

    @property
    def rel(self) -> PurePosixPath:
        return PurePosixPath(self.where[1])


class CheckedSmall(NamedTuple):
    """A small put checked (`ObjectStore.check_small`), not yet stamped: its bytes
    hashed once, whichever way it is then committed."""

    dataset: str
    key: str
    set_id: str | None
    digest: Digest
    data: bytes
    put: SmallPut


class HeldPut:
    """A small put stamped by `ObjectStore.stamp_small`: its version, and its object's
    lock held until `commit_held` lets go of it (`release`, once)."""

    __slots__ = ("_lock", "entry", "version")

    def __init__(self, version: Version, entry: _Entry, lock: threading.Lock) -> None:
        self.version = version
        self.entry = entry
        self._lock: threading.Lock | None = lock

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()


Source = Iterable[bytes | bytearray | memoryview] | BinaryIO


class ObjectStore:
    """The store of one agent. Opening it takes the root's lock (one process per root)
    and runs startup repair (`repair_report` says what it did)."""

    def __init__(
        self,
        root: Path | str,
        *,
        clock: HybridClock,
        keep_versions: int = DEFAULT_KEEP_VERSIONS,
        verify: repair.Verify = "size",
        tombstone_retention_s: int = DEFAULT_TOMBSTONE_RETENTION_S,
        group_commit: bool = True,
    ) -> None:
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int):
            raise ConfigError(f"keep_versions must be an integer, got {keep_versions!r}")
        if keep_versions < 1:
            raise ConfigError(f"keep_versions must be at least 1, got {keep_versions}")
        if tombstone_retention_s < 0:
            raise ConfigError(f"tombstone_retention_s must be >= 0, got {tombstone_retention_s}")
        self.root = Path(root)
        self.clock = clock
        self.region = clock.region
        self.keep_versions = keep_versions
        self.tombstone_retention_s = tombstone_retention_s
        self._lock = threading.RLock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._closed = False
        # Single writes (put, commit_put, delete, apply, commit_apply) commit in groups:
        # see agents/store/group.py and the README's write protocol. Off: one by one.
        self.group_commit = group_commit
        self._group: GroupCommitter[_Entry, list[tuple[str, str]]] = GroupCommitter(
            self._commit_group
        )
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for sub in ("objects", TMP):
                files.make_dirs(self.root, Path(sub))
            # Folders found here may not be durable yet (made by a process that did not
            # finish): one fsync of each parent makes them so, and then a write into
            # a known fan-out folder needs no mkdir, no lock and no parent fsync.
            files.fsync_dir(self.root)
            files.fsync_dir(self.root / OBJECTS)
            self._lock_fd = os.open(self.root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(
                f"store root {self.root} is not usable: {err.strerror or err}"
            ) from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreLockedError(
                f"store root {self.root} is open in another process; one agent per root"
            ) from None
        db: sqlite3.Connection | None = None
        db_path = self.root / "meta.db"
        if not db_path.exists() and _any_file(self.root / OBJECTS):
            # Repair trusts the metadata; with none, it would delete every object.
            self._release()
            raise ConfigError(
                f"store root {self.root} holds objects but no meta.db; restore the metadata "
                "database or empty objects/ before starting"
            )
        try:
            db = connect(db_path)
            found = db.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
            if found[0] != FORMAT:
                raise ConfigError(
                    f"store root {self.root} has metadata format {found[0]}, "
                    f"this agent reads format {FORMAT}"
                )
            self.repair_report: RepairReport = repair.run(self.root, db, verify=verify)
            newest = _newest_stamp(db)
            self._folders = {e.name for e in os.scandir(self.root / OBJECTS) if e.is_dir()}
        except (sqlite3.Error, OSError) as err:
            self._abandon(db)
            raise StorageError(f"store {self.root} could not be opened: {err}") from err
        except BaseException:
            self._abandon(db)
            raise
        self._db = db
        if newest is not None:
            # A clock starts at zero: behind the stamps held here (a physical clock
            # stepped back, a lower offset), a local write would be stamped below the
            # version it overwrites, acked yet never the newest, or collide with a
            # held one's HLC and its file.
            self.clock.advance_past(newest)
            try:
                self.clock.check_skew(newest)
            except ClockSkewError as exc:
                # Stamped by a clock that ran ahead (since corrected, or a lower offset):
                # this agent's writes stay ahead of real time, and other regions refuse
                # them as skewed until it catches up.
                log.error(
                    "store_stamps_ahead_of_clock",
                    root=str(self.root),
                    newest=newest.text,
                    error=str(exc),
                    action="other regions refuse this agent's writes as skewed until "
                    "real time catches up; check the clock and --clock-offset",
                )
        log.info("store opened", root=str(self.root), **vars(self.repair_report))

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the database and release the root (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._db.close()
            self._release()
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def group_stats(self) -> GroupStats:
        """How many group commits ran, holding how many single writes (for benchmarks
        and metrics: their ratio is the mean group size)."""
        return self._group.stats()

    def group_queued(self) -> int:
        """Single writes waiting for the next group commit (a gauge for metrics)."""
        return self._group.queued()

    def _abandon(self, db: sqlite3.Connection | None) -> None:
        if db is not None:
            db.close()
        self._release()

    def _release(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    # -- writes ----------------------------------------------------------------------

    def stage(
        self,
        dataset: str,
        key: str,
        *,
        expected_size: int | None = None,
        max_size: int | None = None,
        expected_digest: Digest | str | None = None,
    ) -> StagedWrite:
        """Begin a write: check the names, open a temporary file. Feed it with
        `write(chunk)`, then `commit_put` or `commit_apply` it."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        self._require_open()
        digest = (
            Digest.parse(expected_digest) if isinstance(expected_digest, str) else expected_digest
        )
        return StagedWrite(
            self.root,
            dataset,
            key,
            expected_size=expected_size,
            max_size=max_size,
            expected_digest=digest,
        )

    def stage_resumable(
        self,
        dataset: str,
        key: str,
        path: Path,
        *,
        offset: int,
        expected_size: int | None = None,
        expected_digest: Digest | str | None = None,
    ) -> StagedWrite:
        """Begin or continue a write whose file outlives this process (a resumable
        transfer's partial bytes, under `transfers/`, which startup repair leaves alone):
        its first `offset` bytes are kept and hashed again, the rest cut off. `detach()`
        keeps the file for a later attempt; a commit moves it into the store as
        `stage()`'s would. The file must be in the root (a rename moves it)."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        self._require_open()
        if self.root.resolve() not in Path(path).resolve().parents:
            raise InvalidInputError(f"a resumable write must be inside {self.root}, not {path}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be an integer >= 0, got {offset!r}")
        digest = (
            Digest.parse(expected_digest) if isinstance(expected_digest, str) else expected_digest
        )
        return StagedWrite(
            self.root,
            dataset,
            key,
            expected_size=expected_size,
            expected_digest=digest,
            path=Path(path),
            resume_offset=offset,
        )

    def record_transfer(
        self, dataset: str, key: str | None, hlc: str | None, data: Mapping[str, JsonValue]
    ) -> None:
        """Journal a transfer record that commits no version (a refused or failed copy,
        a copy sent, or one whose version was already held), for the recorder."""
        dataset = check_name("dataset", dataset)
        with self._tx() as conn:  # StorageError on a database failure
            rows.journal(conn, "transfer", dataset, key, hlc, dict(data))

    def put(
        self,
        dataset: str,
        key: str,
        source: Source,
        *,
        expected_size: int | None = None,
        max_size: int | None = None,
        expected_digest: Digest | str | None = None,
        set_id: str | None = None,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
        transfer: Mapping[str, JsonValue] | None = None,
    ) -> Version:
        """Store a new version written here: stream `source` (chunks, or a binary file
        object read in 1 MiB chunks), hash it in the same pass, commit it with a fresh
        HLC. `outbox=True` (standard datasets) adds its change event in the same
        transaction; `transfer` adds a transfer record to the journal likewise."""
        with self.stage(
            dataset,
            key,
            expected_size=expected_size,
            max_size=max_size,
            expected_digest=expected_digest,
        ) as staged:
            for chunk in _chunks(source):
                staged.write(chunk)
            return self.commit_put(
                staged,
                set_id=set_id,
                outbox=outbox,
                epoch=epoch,
                policy_revision=policy_revision,
                transfer=transfer,
            )

    def put_small(
        self,
        dataset: str,
        key: str,
        data: bytes,
        *,
        expected_size: int | None = None,
        max_size: int | None = None,
        expected_digest: Digest | None = None,
        end_digest: Digest | None = None,
        set_id: str | None = None,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
        on_stamped: Callable[[Version], None] | None = None,
    ) -> Version:
        """`put` of an object whose bytes are all at hand, at most `INLINE_MAX_BYTES`
        (an agent's small Put): checked as a staged write checks them, in the same
        order and with the same errors (past its stated size, past `max_size`, short,
        `expected_digest`, then `end_digest`: a digest stated after the bytes), then
        kept in the metadata database with its version row (`inline_bytes`), no file
        of its own, committed with its group. `on_stamped` as in `commit_put`: told
        the version before the commit is durable, so a critical owner's push starts
        with no file to create first."""
        put = SmallPut(
            dataset,
            key,
            data,
            expected_size,
            max_size,
            expected_digest,
            end_digest,
            set_id,
            outbox,
            epoch,
            policy_revision,
        )
        return self.put_checked(self.check_small(put), on_stamped=on_stamped)

    def put_checked(
        self, checked: CheckedSmall, *, on_stamped: Callable[[Version], None] | None = None
    ) -> Version:
        """`put_small` of a put `check_small` checked (not hashed again): waits for its
        object's lock, as `stamp_small` does not."""
        put = checked.put
        self._require_open()
        return self._commit_local(
            checked.dataset,
            checked.key,
            len(checked.data),
            checked.digest,
            None,
            set_id=checked.set_id,
            outbox=put.outbox,
            epoch=put.epoch,
            policy_revision=put.policy_revision,
            transfer=None,
            on_stamped=on_stamped,
            inline=checked.data,
        )

    def stamp_small(self, checked: CheckedSmall) -> HeldPut | None:
        """`put_small`'s stamp of a put `check_small` checked, without blocking (on an
        agent's event loop: no thread hop before a critical write's push can start): its
        object's lock taken and its version stamped, to be committed by `commit_held`
        (in any thread) with the other puts held meanwhile. None, with nothing taken,
        when its object's lock is held (another write of that object, or of its lock
        stripe, is committing): the caller then uses `put_checked` (given what
        `check_small` returned, so its bytes are hashed once) or `put_small` in a
        thread, which waits for it. The put's own errors were raised by `check_small`."""
        put = checked.put
        self._require_open()
        lock = self._stripes[stripe_of(checked.dataset, checked.key)]
        if not lock.acquire(blocking=False):
            return None
        try:
            version = Version.put(self.clock.now(), len(checked.data), checked.digest)
        except BaseException:
            lock.release()
            raise
        entry = _Entry(
            checked.dataset,
            checked.key,
            version,
            None,
            checked.set_id,
            put.outbox,
            put.epoch,
            put.policy_revision,
            None,
            inline=checked.data,
        )
        return HeldPut(version, entry, lock)

    def commit_held(
        self, held: Sequence[HeldPut]
    ) -> tuple[list[Version | Exception], list[tuple[str, str]]]:
        """Commit puts stamped by `stamp_small` (in groups of at most MAX_GROUP, merged
        with whatever the store's other threads commit), then let go of their objects'
        locks, whatever happened. Returns per put its version, or the error of its
        write alone (an object of its own), and the (dataset, set) pairs these writes
        completed: the caller hands those to `prune_sets` in a thread that waits for
        nothing it commits (pruning takes object locks, one of which may belong to a
        put queued behind this commit)."""
        outcomes: list[Version | Exception] = []
        completed: list[tuple[str, str]] = []
        told: set[int] = set()
        try:
            for at in range(0, len(held), MAX_GROUP):
                part = held[at : at + MAX_GROUP]
                try:
                    self._require_open()
                    results = self._install_entries([h.entry for h in part])
                except Exception as err:  # noqa: BLE001 - closed: each write is refused
                    results = [err] * len(part)
                for h, result in zip(part, results, strict=True):
                    if isinstance(result, list):
                        completed += result
                        outcomes.append(h.version)
                    elif isinstance(result, Exception):
                        # A failed COMMIT fails its group with one error: one object
                        # per write, so no traceback gathers every waiter's frames.
                        outcomes.append(own_copy(result) if id(result) in told else result)
                        told.add(id(result))
                    else:  # not a write's outcome: an interrupt of this thread
                        raise result
        finally:
            for h in held:
                h.release()
        return outcomes, completed

    def prune_sets(self, completed: Iterable[tuple[str, str]]) -> None:
        """What `commit_held` left to do: prune for each set its writes completed.
        Takes object locks one at a time: call it with none held."""
        self._settle(completed)

    def _install_entries(
        self, entries: Sequence[_Entry]
    ) -> Sequence[list[tuple[str, str]] | BaseException]:
        """Commit versions of distinct objects (their locks held) in one group: per
        entry the (dataset, set) pairs it completed, or its error."""
        if self.group_commit:
            return self._group.submit_many(entries)
        out: list[list[tuple[str, str]] | BaseException] = []
        for entry in entries:
            try:
                out.append(self._install_many([entry]))
            except Exception as err:  # noqa: BLE001 - this write alone failed
                out.append(err)
        return out

    def check_small(self, put: SmallPut) -> CheckedSmall:
        """A small put's names, sizes and digests checked (`put_small`'s order and
        errors), before its object's lock is taken; for `stamp_small` and
        `put_checked`."""
        dataset, key = check_name("dataset", put.dataset), check_name("key", put.key)
        set_id = None if put.set_id is None else check_name("set", put.set_id)
        data = put.data
        if len(data) > INLINE_MAX_BYTES:
            raise InvalidInputError(
                f"put_small of {dataset}/{key}: {len(data)} bytes is more than the "
                f"{INLINE_MAX_BYTES} kept inline; stage it"
            )
        stated = len(data) if put.expected_size is None else put.expected_size
        if put.max_size is not None and stated >= len(data) > put.max_size:
            raise TooLargeError(
                f"object {dataset}/{key} passed the cap of {put.max_size} bytes; nothing was stored"
            )
        digest = checked_bytes(
            dataset,
            key,
            memoryview(data).cast("B"),
            expected_size=stated,
            expected_digest=put.expected_digest,
        )
        if put.end_digest is not None and digest != put.end_digest:
            raise DigestMismatchError(
                f"object {dataset}/{key} hashed to {digest}, not the stated {put.end_digest}; "
                "nothing was stored"
            )
        return CheckedSmall(dataset, key, set_id, digest, bytes(data), put)

    def commit_put(
        self,
        staged: StagedWrite,
        *,
        set_id: str | None = None,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
        transfer: Mapping[str, JsonValue] | None = None,
        on_stamped: Callable[[Version], None] | None = None,
    ) -> Version:
        """Commit a staged write as a new local version (HLC assigned at commit, under the
        object's lock, so the last commit of an object is its newest version).
        `on_stamped(version)` is told the version as soon as it has its HLC, before
        the commit is durable (a critical owner pushes it meanwhile); it must not block."""
        set_id = None if set_id is None else check_name("set", set_id)
        with staged:
            digest = self._finish(staged)
            return self._commit_local(
                staged.dataset,
                staged.key,
                staged.size,
                digest,
                staged,
                set_id=set_id,
                outbox=outbox,
                epoch=epoch,
                policy_revision=policy_revision,
                transfer=transfer,
                on_stamped=on_stamped,
            )

    def _commit_local(
        self,
        dataset: str,
        key: str,
        size: int,
        digest: Digest,
        staged: StagedWrite | None,
        *,
        set_id: str | None,
        outbox: bool,
        epoch: int,
        policy_revision: int | None,
        transfer: Mapping[str, JsonValue] | None,
        on_stamped: Callable[[Version], None] | None,
        inline: bytes | None = None,
    ) -> Version:
        """A put written here, its bytes checked (in `staged`, or `inline`): its HLC
        assigned under the object's lock, told to `on_stamped`, then committed with its
        group (`commit_put`, `put_small`)."""
        with self._object_lock(dataset, key):
            version = Version.put(self.clock.now(), size, digest)
            if on_stamped is not None:
                on_stamped(version)
            completed = self._install(
                dataset,
                key,
                version,
                staged,
                set_id=set_id,
                outbox=outbox,
                epoch=epoch,
                policy_revision=policy_revision,
                transfer=transfer,
                inline=inline,
            )
        self._settle(completed)
        return version

    def delete(
        self,
        dataset: str,
        key: str,
        *,
        set_id: str | None = None,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
    ) -> Version:
        """Write a tombstone: a version (with a fresh HLC) that hides the object. An object
        with no live version gets NotFoundError (nothing is written)."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        set_id = None if set_id is None else check_name("set", set_id)
        with self._object_lock(dataset, key):
            held = self.head(dataset, key)
            if held is None or held.is_tombstone:
                raise NotFoundError(f"object {dataset}/{key} is not stored here; nothing to delete")
            version = Version.delete(self.clock.now())
            completed = self._install(
                dataset,
                key,
                version,
                None,
                set_id=set_id,
                outbox=outbox,
                epoch=epoch,
                policy_revision=policy_revision,
                transfer=None,
            )
        self._settle(completed)
        return version

    def apply(
        self,
        dataset: str,
        key: str,
        version: Version,
        source: Source | None = None,
        *,
        set_id: str | None = None,
        transfer: Mapping[str, JsonValue] | None = None,
    ) -> ApplyResult:
        """Apply a version made elsewhere, by last-writer-wins (`lww`): stored only if its
        HLC is greater than the newest held; an older or equal one is a no-op (its
        bytes are not even read). A put's bytes must match its size and digest
        (DigestMismatchError otherwise, nothing stored). The clock observes the HLC
        first (ClockSkewError if it is too far ahead)."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        if version.is_tombstone != (source is None):
            raise InvalidInputError(
                f"apply of {dataset}/{key} at {version.hlc}: a put needs its bytes and a "
                "tombstone takes none"
            )
        self.clock.observe(version.hlc)
        if not self.wanted(dataset, key, version, set_id):
            result = self._result_without_write(dataset, key, version)
            if not result.verdict.applies:
                return result
            # Wanted now: the newer version went between the two looks (a takeover's
            # rewind). Applied below, decided again under the lock, never answered
            # "applied" with nothing stored.
        if source is None:
            with self._object_lock(dataset, key):
                held = self.head(dataset, key)
                verdict = lww(version, held)
                if not verdict.applies:
                    return ApplyResult(verdict, held or version)
                completed = self._install(
                    dataset,
                    key,
                    version,
                    None,
                    set_id=set_id,
                    outbox=False,
                    epoch=0,
                    policy_revision=None,
                    transfer=transfer,
                )
            self._settle(completed)
            return ApplyResult(verdict, version)
        with self.stage(
            dataset, key, expected_size=version.size, expected_digest=version.digest
        ) as staged:
            for chunk in _chunks(source):
                staged.write(chunk)
            return self.commit_apply(staged, version, set_id=set_id, transfer=transfer)

    def _take_bytes(
        self, dataset: str, key: str, version: Version, source: Source
    ) -> bytes | StagedWrite:
        """An applied put's bytes: checked and kept in memory when small (inline), else
        staged in a file (not yet synced)."""
        small = _small(source)
        if small is None:
            return self._stage_apply(dataset, key, version, source)
        checked_bytes(
            dataset,
            key,
            memoryview(small).cast("B"),
            expected_size=version.size,
            expected_digest=version.digest,
        )
        return bytes(small)

    def commit_apply(
        self,
        staged: StagedWrite,
        version: Version,
        *,
        set_id: str | None = None,
        transfer: Mapping[str, JsonValue] | None = None,
    ) -> ApplyResult:
        """Commit a staged write (stage it with the version's size and digest) as a
        version made elsewhere, by LWW. A version this store holds but whose bytes
        startup repair found missing is restored from it."""
        if version.is_tombstone:
            raise InvalidInputError("a tombstone has no bytes to commit; apply it without a source")
        set_id = None if set_id is None else check_name("set", set_id)
        with staged:
            # Observed before the fsync, not after it: a version admitted here just
            # before a move of its dataset must be older than any write made here after
            # the move, or it would supersede one by LWW as its fsync ends (seconds for
            # a big one).
            self.clock.observe(version.hlc)
            self._finish(staged)
            if staged.digest != version.digest or staged.size != version.size:
                raise InvalidInputError(
                    f"staged bytes of {staged.dataset}/{staged.key} ({staged.size} bytes, "
                    f"{staged.digest}) are not version {version.hlc}'s; stage with its size "
                    "and digest"
                )
            dataset, key = staged.dataset, staged.key
            with self._object_lock(dataset, key):
                held_row = self._row(dataset, key, version.hlc)
                if held_row is not None:
                    if held_row.state != "missing" or held_row.version != version:
                        return self._result_without_write(dataset, key, version)
                    staged.finish()  # a restore renames over a row's path: durable first
                    completed = self._restore(held_row, staged)
                    result = ApplyResult(Verdict.SAME, self.head(dataset, key) or version, True)
                else:
                    held = self.head(dataset, key)
                    verdict = lww(version, held)
                    # An older member a recorded set still needs is stored under the
                    # newest (`_set_needs`); the answer names the newest, its head.
                    needed = verdict is Verdict.OLDER and self._set_needs(
                        dataset, key, version, set_id
                    )
                    if not verdict.applies and not needed:
                        return ApplyResult(verdict, held or version)
                    completed = self._install(
                        dataset,
                        key,
                        version,
                        staged,
                        set_id=set_id,
                        outbox=False,
                        epoch=0,
                        policy_revision=None,
                        transfer=transfer,
                    )
                    result = (
                        ApplyResult(Verdict.APPLY, held)  # stored; the newest stays newest
                        if needed and held is not None
                        else ApplyResult(verdict, version)
                    )
            self._settle(completed)
            return result

    def put_many(
        self,
        items: Sequence[tuple[str, str, Source]],
        *,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
    ) -> list[Version]:
        """Store several new local versions (a bundle of small objects) as `put` would,
        but committed together: the temporary files and the folders are fsynced in
        parallel (a disk with a deep queue serves them at once) and every row goes in
        one SQLite transaction (one WAL flush). All or nothing: on any error none is
        stored. Each (dataset, key) at most once."""
        self._distinct([(d, k) for d, k, _ in items])
        staged: list[StagedWrite] = []
        try:
            for dataset, key, source in items:
                staged.append(self.stage(dataset, key))
                for chunk in _chunks(source):
                    staged[-1].write(chunk)
                staged[-1].finish(sync=False)
            self._each_staged(staged)
            with self._object_locks([(s.dataset, s.key) for s in staged]):
                entries = [
                    _Entry(
                        s.dataset,
                        s.key,
                        Version.put(self.clock.now(), s.size, s.digest),
                        s,
                        outbox=outbox,
                        epoch=epoch,
                        policy_revision=policy_revision,
                    )
                    for s in staged
                ]
                completed = self._install_many(entries)
        finally:
            for s in staged:
                s.abort()  # after the commit this removes nothing
        self._settle(completed)
        return [e.version for e in entries]

    def apply_many(
        self,
        items: Sequence[tuple[str, str, Version, Source | None]],
        *,
        transfer: Mapping[str, JsonValue] | None = None,
        transfers: Sequence[Mapping[str, JsonValue] | None] | None = None,
        gate: Callable[[], None] | None = None,
    ) -> list[ApplyResult]:
        """`apply` for a bundle of versions made elsewhere, committed together as in
        `put_many` (`transfer` is journalled once for the bundle; `transfers`, one per
        item, each with its item's version when it is stored). Each item is decided
        by LWW on its own; the results come in the order of `items`. A bad item
        (digest, size) fails the whole bundle and stores none.
        `gate()` is called in this thread once the bundle's bytes are staged, before
        any lock is taken or row written; if it raises, nothing is stored and its
        error propagates. A replica waits there for its fresh owner read, so that the
        read overlaps the staging instead of preceding it (replica_pushes.py)."""
        self._distinct([(d, k) for d, k, _, _ in items])
        if transfers is not None and len(transfers) != len(items):
            raise InvalidInputError(
                f"apply_many: {len(transfers)} transfer records for {len(items)} items"
            )
        checked = []
        for raw_dataset, raw_key, version, source in items:
            dataset, key = check_name("dataset", raw_dataset), check_name("key", raw_key)
            if version.is_tombstone != (source is None):
                raise InvalidInputError(
                    f"apply of {dataset}/{key} at {version.hlc}: a put needs its bytes and a "
                    "tombstone takes none"
                )
            checked.append((dataset, key, version, source))
        names = [(d, k) for d, k, _, _ in checked]
        # One lookup of what is held for the whole bundle (not several per object):
        # before staging, to read only the bytes LWW wants; again under the locks,
        # where the decision is made (another writer may have committed meanwhile).
        before = self._held_many(names)
        staged: dict[int, StagedWrite] = {}
        inline: dict[int, bytes] = {}  # checked bytes kept in the database, no file
        try:
            for n, (dataset, key, version, source) in enumerate(checked):
                if source is None or not _wanted_in(before.get((dataset, key), ()), version):
                    continue
                taken = self._take_bytes(dataset, key, version, source)
                if isinstance(taken, bytes):
                    inline[n] = taken
                else:
                    staged[n] = taken
            # Many small files: closed unsynced, renamed under the locks, then ONE syncfs
            # makes their bytes and renames durable before the rows commit
            # (`_install_many`, synced=False). Few: fsynced here, in parallel.
            bulk = len(staged) >= SYNCFS_MIN_FILES and files.can_syncfs()
            if bulk:
                for s in staged.values():
                    s.close_unsynced()
            else:
                self._each_staged(list(staged.values()))
            synced = not bulk
            if gate is not None:
                gate()
            # After the gate: a copy it refuses must not move this store's clock.
            for _, _, version, _ in checked:
                self.clock.observe(version.hlc)
            results: list[ApplyResult | None] = [None] * len(checked)
            entries: list[_Entry] = []
            completed: list[tuple[str, str]] = []
            with self._object_locks(names):
                now = self._held_many(names)
                for n, (dataset, key, version, source) in enumerate(checked):
                    found = now.get((dataset, key), ())
                    row = _at(found, version.hlc)
                    held = found[0].version if found else None
                    verdict = lww(version, held)
                    if (
                        verdict is Verdict.APPLY
                        and row is None
                        and source is not None
                        and n not in staged
                        and n not in inline
                    ):
                        # Older than what was held before the gate, newest now: the newer
                        # version went meanwhile (a takeover's rewind of a deposed owner's
                        # write). Its bytes are wanted after all: read now, under the
                        # locks (rare), rather than answer "applied" with nothing stored.
                        taken = self._take_bytes(dataset, key, version, source)
                        if isinstance(taken, bytes):
                            inline[n] = taken
                        else:
                            staged[n] = taken
                            taken.finish()
                    if (
                        row is not None
                        and (n in staged or n in inline)
                        and row.state == "missing"
                        and row.version == version
                    ):
                        if n in inline:
                            # A lost version comes back as a file, the one way `_restore`
                            # knows (rare: startup repair found it damaged), fsynced first.
                            staged[n] = self._stage_apply(dataset, key, version, [inline[n]])
                            staged[n].finish()
                        if not synced:  # a restore renames over a row's path: bytes first
                            self._syncfs()
                            synced = True
                        completed += self._restore(row, staged[n])
                        results[n] = ApplyResult(Verdict.SAME, held or version, True)
                        continue
                    if row is not None and verdict is not Verdict.APPLY:
                        verdict = Verdict.SAME if row.version == version else Verdict.COLLISION
                    held_bytes = n in staged or n in inline
                    if not verdict.applies or (not version.is_tombstone and not held_bytes):
                        results[n] = ApplyResult(verdict, held or version)
                        continue
                    entries.append(
                        _Entry(
                            dataset,
                            key,
                            version,
                            staged.get(n),
                            transfer=None if transfers is None else transfers[n],
                            inline=inline.get(n),
                        )
                    )
                    results[n] = ApplyResult(verdict, version)
                completed += self._install_many(entries, transfer=transfer, synced=synced)
        finally:
            for s in staged.values():
                s.abort()
        self._settle(completed)
        return [r for r in results if r is not None]

    def _stage_apply(self, dataset: str, key: str, version: Version, source: Source) -> StagedWrite:
        """An applied put's bytes (names checked) staged unsynced, checked against its
        size and digest: one chunk at hand (an inline event's) in one go, else streamed."""
        if (
            isinstance(source, list | tuple)
            and len(source) == 1
            and isinstance(source[0], bytes | bytearray | memoryview)
            and len(source[0]) < HOLE_MIN_BYTES
        ):
            self._require_open()
            return StagedWrite.of_bytes(
                self.root,
                dataset,
                key,
                source[0],
                expected_size=version.size,
                expected_digest=version.digest,
            )
        staged = self.stage(
            dataset, key, expected_size=version.size, expected_digest=version.digest
        )
        try:
            for chunk in _chunks(source):
                staged.write(chunk)
            staged.finish(sync=False)
        except BaseException:
            staged.abort()
            raise
        return staged

    def _distinct(self, names: Sequence[tuple[str, str]]) -> None:
        seen: set[tuple[str, str]] = set()
        for dataset, key in names:
            if (dataset, key) in seen:
                raise InvalidInputError(f"object {dataset}/{key} is twice in one bundle")
            seen.add((dataset, key))

    def _each_staged(self, staged: Sequence[StagedWrite]) -> None:
        if len(staged) >= SYNCFS_MIN_FILES and files.can_syncfs():
            # Many small files: one syncfs makes them all durable (thousands of fsyncs
            # cost a bundle of 4 KiB objects ~1 ms each even in parallel).
            for s in staged:
                s.close_unsynced()
            self._syncfs()
            return
        if len(staged) <= 1:
            for s in staged:
                s.finish()
            return
        _raise_first(self._parallel([s.finish for s in staged]))

    def _held_many(
        self, names: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], list[StoredVersion]]:
        """Every version held of each named object (names checked), newest first, in
        one query per dataset and `rows.LOOKUP_KEYS` keys."""
        by_dataset: dict[str, list[str]] = {}
        for dataset, key in names:
            by_dataset.setdefault(dataset, []).append(key)
        found: dict[tuple[str, str], list[StoredVersion]] = {}
        with self._lock:
            self._require_open()
            for dataset, keys in by_dataset.items():
                for at in range(0, len(keys), rows.LOOKUP_KEYS):
                    part = keys[at : at + rows.LOOKUP_KEYS]
                    marks = ",".join("?" * len(part))
                    for row in self._db.execute(
                        rows.SELECT_VERSIONS
                        + f" WHERE dataset = ? AND key IN ({marks}) ORDER BY key, hlc DESC",
                        (dataset, *part),
                    ):
                        stored = rows.to_stored(row[:-1])
                        found.setdefault((dataset, stored.key), []).append(stored)
        return found

    def wanted(self, dataset: str, key: str, version: Version, set_id: str | None) -> bool:
        """Whether `version` (a member of `set_id`, if named) should be stored here, so
        its bytes are worth reading or pulling: LWW would apply it, it restores bytes
        startup repair found missing, or a set recorded here still needs it
        (`_set_needs`)."""
        row = self._row(dataset, key, version.hlc)
        if row is not None:
            return row.state == "missing" and row.version == version
        if lww(version, self.head(dataset, key)).applies:
            return True
        return self._set_needs(dataset, key, version, set_id)

    def _result_without_write(self, dataset: str, key: str, version: Version) -> ApplyResult:
        held = self.head(dataset, key)
        verdict = lww(version, held)
        row = self._row(dataset, key, version.hlc)
        if row is not None and verdict is Verdict.OLDER:
            verdict = Verdict.SAME if row.version == version else Verdict.COLLISION
        return ApplyResult(verdict, held or version)

    def _install(
        self,
        dataset: str,
        key: str,
        version: Version,
        staged: StagedWrite | None,
        *,
        set_id: str | None,
        outbox: bool,
        epoch: int,
        policy_revision: int | None,
        transfer: Mapping[str, JsonValue] | None,
        inline: bytes | None = None,
    ) -> list[tuple[str, str]]:
        """Commit one version (its object's lock held): with its group, or alone."""
        entry = _Entry(
            dataset,
            key,
            version,
            staged,
            set_id,
            outbox,
            epoch,
            policy_revision,
            transfer,
            inline=inline,
        )
        if not self.group_commit:
            return self._install_many([entry])
        target = None if staged is None else self._place(entry, staged)
        try:
            return self._group.submit(entry)
        except InterruptedCommitError:
            raise  # perhaps committed: startup repair decides whether its file stays
        except Exception:
            if target is not None:
                files.remove_file(target)  # its row did not commit: it must not stay
            raise

    def _place(self, entry: _Entry, staged: StagedWrite) -> Path:
        """Steps 3-4 of a single write under group commit, in the writer's own thread (so
        the writers' fsyncs run in parallel, and no GIL hand-off serialises them in the
        leader): rename the file to its version path, then fsync it (on ext4 that also
        commits the rename). Its folder is fsynced by the group, once for all."""
        rel = entry.rel
        target = self.root / rel
        try:
            self._folder(rel)
            files.replace(staged.path, target)
        except OSError as err:
            raise self._not_stored(entry, err) from err
        staged.moved()
        try:
            staged.finish()  # fsyncs the file (it was finished without, see _finish)
        except BaseException:
            files.remove_file(target)
            raise
        return target

    def _finish(self, staged: StagedWrite) -> Digest:
        """Step 2 of a single write: check the size and digest; fsync now unless group
        commit is on (then `_place` fsyncs it after its rename)."""
        return staged.finish(sync=not self.group_commit)

    def _install_many(
        self,
        entries: Sequence[_Entry],
        *,
        transfer: Mapping[str, JsonValue] | None = None,
        synced: bool = True,
    ) -> list[tuple[str, str]]:
        """Steps 3-5 of the write protocol (the objects' locks held): rename each fsynced
        temporary file to its version's path, fsync the folders, commit the rows with
        their journal and outbox rows and the pruning of old bases in ONE transaction;
        then remove the pruned files (a crash before that leaves files without rows,
        which startup removes). `transfer` is journalled once, with the first entry.
        `synced=False`: the files' bytes are not durable yet (a bundle closed without
        fsyncs); they are renamed first and ONE syncfs then makes bytes and renames
        durable together, before the rows commit (as under group commit, a crash
        before the COMMIT leaves files without rows, whatever reached the disk, and
        startup removes them). Returns the (dataset, set) pairs these versions
        completed: the caller prunes for them once it has let go of the objects'
        locks (`_settle`)."""
        # Paths as text in this loop: it runs once per object of a bundle, and pathlib's
        # joins and conversions cost more than the rename itself.
        root = os.fspath(self.root)
        targets: list[str] = []
        fans: set[str] = set()
        completed: list[tuple[str, str]] = []
        victims: list[Path] = []
        try:
            self._make_folders([e.where[0] for e in entries if e.staged])
            for e in entries:
                if e.staged is None:
                    continue
                fan, rel = e.where
                if fan not in self._folders:
                    self._folder(e.rel)
                fans.add(fan)
                target = f"{root}/{rel}"
                files.replace(e.staged.path, target)
                e.staged.moved()  # its abort then has no temporary to unlink
                targets.append(target)
            if not synced or (len(fans) >= SYNCFS_MIN_FILES and files.can_syncfs()):
                self._syncfs()  # every byte and rename of the bundle at once
            else:
                self._each(files.fsync_dir, [self.root / OBJECTS / fan for fan in sorted(fans)])
            with self._tx() as conn:
                done, victims = self._write_rows(conn, entries, transfer)
            completed = [pair for pairs in done for pair in pairs]
        except BaseException as err:
            for target in targets:
                files.remove_file(target)  # its row did not commit: it must not stay
            if isinstance(err, OSError):
                raise StorageError(
                    f"store {self.root} could not commit {len(entries)} version(s): "
                    f"{err.strerror or err}; nothing was stored"
                ) from err
            raise
        self._remove_files(victims)
        return completed

    def _write_rows(
        self,
        conn: sqlite3.Connection,
        entries: Sequence[_Entry],
        transfer: Mapping[str, JsonValue] | None = None,
    ) -> tuple[list[list[tuple[str, str]]], list[Path]]:
        """Step 5's rows of `entries` in the open transaction: each version row with its
        journal and outbox rows, the sets they complete, and the pruning of old bases.
        Returns, per entry, the (dataset, set) pairs it completed, and the pruned files
        (to remove after the commit)."""
        completed: list[list[tuple[str, str]]] = [[] for _ in entries]
        victims: list[Path] = []
        # Batched: one executemany per table (the rows go in item order, the
        # bundle's transfer record after its first version, as one by one).
        stored_ms = rows.now_ms()
        version_rows = []
        journal_rows = []
        inline_rows = []
        for n, e in enumerate(entries):
            hlc = e.version.hlc.text
            relative = None if e.staged is None else e.where[1]
            if e.inline is not None:
                inline_rows.append((e.dataset, e.key, hlc, e.inline))
            version_rows.append(
                (
                    e.dataset,
                    e.key,
                    hlc,
                    e.version.op,
                    e.version.size,
                    None if e.version.digest is None else e.version.digest.text,
                    e.set_id,
                    stored_ms,
                    relative,
                )
            )
            data = rows.version_data(e.version)
            data["set"] = e.set_id
            journal_rows.append(rows.journal_row("version", e.dataset, e.key, hlc, data, stored_ms))
            if transfer is not None and n == 0:
                journal_rows.append(
                    rows.journal_row("transfer", e.dataset, e.key, hlc, dict(transfer), stored_ms)
                )
            if e.transfer is not None:
                journal_rows.append(
                    rows.journal_row("transfer", e.dataset, e.key, hlc, dict(e.transfer), stored_ms)
                )
        conn.executemany(
            "INSERT INTO versions (dataset, key, hlc, op, size, digest, state,"
            " set_id, stored_ms, path) VALUES (?, ?, ?, ?, ?, ?, 'present', ?, ?, ?)",
            version_rows,
        )
        if inline_rows:
            conn.executemany(
                "INSERT INTO inline_bytes (dataset, key, hlc, data) VALUES (?, ?, ?, ?)",
                inline_rows,
            )
        rows.journal_many(conn, journal_rows)
        for e in entries:
            if e.outbox:
                self._add_event(
                    conn,
                    "version",
                    e.dataset,
                    e.key,
                    e.version,
                    e.set_id,
                    e.epoch,
                    e.policy_revision,
                )
        # Only objects that now hold more than keep_versions rows can prune, and
        # only datasets with version sets can complete one: ask once for all.
        names = [(e.dataset, e.key) for e in entries]
        with_sets = rows.datasets_with_sets(conn, {d for d, _ in names})
        # Without sets nothing is pinned: the whole group's bases go in a few statements.
        plain = [(d, k) for d, k in names if d not in with_sets]
        if plain:
            old = rows.past_keep(conn, plain, self.keep_versions)
            victims += self._delete_rows(conn, old, "pruned", in_sets=False)
        if len(plain) < len(names):
            crowded = rows.crowded(
                conn, [(d, k) for d, k in names if d in with_sets], self.keep_versions
            )
            for n, e in enumerate(entries):
                if e.dataset not in with_sets:
                    continue
                done = rows.refresh_sets_of(conn, e.dataset, e.key, e.version.hlc.text)
                completed[n] += [(e.dataset, set_id) for set_id in done]
                if (e.dataset, e.key) in crowded:
                    victims += self._prune_rows(conn, e.dataset, e.key)
        return completed, victims

    def _commit_group(
        self, entries: Sequence[_Entry]
    ) -> list[list[tuple[str, str]] | BaseException]:
        """Step 4's folder fsyncs and step 5 for the single writes of one group (run by its
        leader, see group.py; each writer holds its object's lock, so no object is
        twice in a group, and has placed its file, see `_place`): each folder is
        fsynced once, all of them in parallel, then ONE transaction holds every row.
        Per entry its completed sets, or the error that write alone gets (its writer
        then removes its file): a failed folder fsync fails the writes into that
        folder, a failed row rolls back to its savepoint; the others commit. A failed
        COMMIT fails them all (nothing stored)."""
        outcome: list[list[tuple[str, str]] | BaseException | None] = [None] * len(entries)
        ok: dict[int, list[tuple[str, str]]] = {}
        by_folder: dict[Path, list[int]] = {}
        for n, e in enumerate(entries):
            if e.staged is not None:
                by_folder.setdefault(self.root / e.rel.parent, []).append(n)
        jobs = [
            (functools.partial(files.fsync_dir, folder), members)
            for folder, members in sorted(by_folder.items())
        ]
        failures = self._parallel([job for job, _ in jobs])
        for (_, members), failed in zip(jobs, failures, strict=True):
            if failed is not None:
                for n in members:
                    outcome[n] = outcome[n] or self._not_stored(entries[n], failed)
        live = [n for n in range(len(entries)) if outcome[n] is None]
        if live:
            try:
                with self._tx() as conn:
                    victims = self._group_rows(conn, entries, live, outcome, ok)
            except Exception as err:  # noqa: BLE001 - COMMIT failed or store closed: all fail
                for n in ok:
                    outcome[n] = err
            else:
                for n, done in ok.items():
                    outcome[n] = done
                self._remove_files(victims)
        return [
            StorageError(f"store {self.root}: a write of its group was left undecided")
            if o is None
            else o
            for o in outcome
        ]

    def _group_rows(
        self,
        conn: sqlite3.Connection,
        entries: Sequence[_Entry],
        live: Sequence[int],
        outcome: list[list[tuple[str, str]] | BaseException | None],
        ok: dict[int, list[tuple[str, str]]],
    ) -> list[Path]:
        """The rows of a group's `live` entries in the open transaction: batched (one
        statement per table) when they all insert cleanly, else one savepoint each, so
        that a row that fails (a constraint) fails its own write only. Fills `ok`
        (entry -> its completed sets) and `outcome` (entry -> its error); returns the
        pruned files."""
        conn.execute("SAVEPOINT grp")
        try:
            done, victims = self._write_rows(conn, [entries[n] for n in live])
        except Exception:  # noqa: BLE001 - isolated one by one below
            conn.execute("ROLLBACK TO grp")
            conn.execute("RELEASE grp")
        else:
            conn.execute("RELEASE grp")
            ok.update(zip(live, done, strict=True))
            return victims
        victims = []
        for n in live:
            conn.execute("SAVEPOINT one")
            try:
                one, pruned = self._write_rows(conn, [entries[n]])
            except Exception as err:  # noqa: BLE001 - this write alone fails
                conn.execute("ROLLBACK TO one")
                conn.execute("RELEASE one")
                outcome[n] = self._not_stored(entries[n], err)
                continue
            conn.execute("RELEASE one")
            ok[n] = one[0]
            victims += pruned
        return victims

    def _not_stored(self, entry: _Entry, err: BaseException) -> BaseException:
        """The error of one write of a group that did not commit."""
        if isinstance(err, StorageError | InvalidInputError | UnavailableError):
            return err
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return StorageError(
            f"store {self.root} could not commit {entry.dataset}/{entry.key} at "
            f"{entry.version.hlc}: {why}; nothing was stored"
        )

    def _parallel(self, jobs: Sequence[Callable[[], object]]) -> list[BaseException | None]:
        """Run blocking calls (fsyncs) at once: all but the first on the store's fsync
        threads, the first on this one. Per job its exception, or None."""
        pool = self._fsync_pool()
        futures = []
        try:
            futures += [pool.submit(job) for job in jobs[1:]]
        except RuntimeError as err:  # the store closed meanwhile (its pool shut down)
            for f in futures:
                f.exception()  # let the jobs already submitted end first
            raise UnavailableError(f"store {self.root} is closed") from err
        errors: list[BaseException | None] = []
        for job in jobs[:1]:
            try:
                job()
                errors.append(None)
            except Exception as err:  # noqa: BLE001 - returned, as the futures' are
                errors.append(err)
        errors += [f.exception() for f in futures]
        return errors

    def _fsync_pool(self) -> ThreadPoolExecutor:
        # One pool for the store's life: a pool per bundle started (and joined) a thread
        # per file, which cost a replica more CPU than the fsyncs it ran.
        with self._pool_lock:
            self._require_open()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_FSYNC_THREADS, thread_name_prefix="store-fsync")
            return self._pool

    def _syncfs(self) -> None:
        try:
            files.syncfs(self.root)
        except OSError as err:
            raise StorageError(
                f"store {self.root} could not make a bundle durable: {err.strerror or err}; "
                "nothing was stored"
            ) from err

    def _each(self, fn: Callable[[Path], None], items: Sequence[Path]) -> None:
        """Run a blocking call (an fsync) on each item, in parallel when there are several:
        the file system then commits them together instead of one after another."""
        if len(items) <= 1:
            for item in items:
                fn(item)
            return
        _raise_first(self._parallel([functools.partial(fn, item) for item in items]))

    def _make_folders(self, fans: Sequence[str]) -> None:
        """Make the new fan-out folders (by name) of a bundle at once, with one fsync of
        `objects/` for all of them (one per folder cost a bundle of 1,000 new objects
        ~3 s)."""
        new = {fan for fan in fans if fan not in self._folders}
        if len(new) <= 1:
            return  # `_folder` makes a single one as it always did
        files.make_children(self.root / OBJECTS, new)
        self._folders.update(new)

    def _folder(self, rel: PurePosixPath) -> Path:
        """The fan-out folder of a version path, made (durably) if it is new."""
        name = rel.parent.name
        if name not in self._folders:
            files.make_dirs(self.root, Path(rel.parent))
            self._folders.add(name)
        return self.root / rel.parent

    def _restore(self, held: StoredVersion, staged: StagedWrite) -> list[tuple[str, str]]:
        rel = version_path(held.dataset, held.key, held.version.hlc)
        folder = self._folder(rel)
        files.replace(staged.path, self.root / rel)
        files.fsync_dir(folder)
        with self._tx() as conn:
            # With its path: an inline version restored is a file from now on (its
            # row had no path, and a put row without one reads from `inline_bytes`).
            conn.execute(
                "UPDATE versions SET state = 'present', path = ?"
                " WHERE dataset = ? AND key = ? AND hlc = ?",
                (str(rel), held.dataset, held.key, held.version.hlc.text),
            )
            conn.execute(
                "DELETE FROM inline_bytes WHERE dataset = ? AND key = ? AND hlc = ?",
                (held.dataset, held.key, held.version.hlc.text),
            )
            hlc = held.version.hlc.text
            rows.journal(conn, "restored", held.dataset, held.key, hlc, {"hlc": hlc})
            done = rows.refresh_sets_of(conn, held.dataset, held.key, hlc)
        return [(held.dataset, set_id) for set_id in done]

    def _add_event(
        self,
        conn: sqlite3.Connection,
        kind: Literal["version", "set"],
        dataset: str,
        key: str | None,
        version: Version | None,
        set_id: str | None,
        epoch: int,
        policy_revision: int | None,
        *,
        set_hlc: HLC | None = None,
        members: Mapping[str, HLC] | None = None,
    ) -> None:
        hlc = version.hlc if version is not None else set_hlc
        if hlc is None:
            raise InvalidInputError("a change event needs a version or a set HLC")
        conn.execute(
            "INSERT INTO outbox (event_id, kind, dataset, key, hlc, op, size, digest, set_id,"
            " members, origin_region, epoch, policy_revision, created_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                uuid.uuid4().hex,
                kind,
                dataset,
                key,
                hlc.text,
                None if version is None else version.op,
                None if version is None else version.size,
                None if version is None or version.digest is None else version.digest.text,
                set_id,
                None if members is None else json.dumps({k: v.text for k, v in members.items()}),
                hlc.region,
                epoch,
                policy_revision,
                rows.now_ms(),
            ),
        )

    # -- pruning ---------------------------------------------------------------------

    def _prune_rows(self, conn: sqlite3.Connection, dataset: str, key: str) -> list[Path]:
        """Delete the rows of versions past the newest `keep_versions` of an object, except
        those a version set still needs (members of the newest complete set of the
        dataset and of any newer set); return their files, to remove after commit."""
        floor = rows.set_floor(conn, dataset) or ""
        pinned = {
            row[0]
            for row in conn.execute(
                "SELECT m.hlc FROM set_members AS m JOIN sets AS s"
                " ON s.dataset = m.dataset AND s.set_id = m.set_id"
                " WHERE m.dataset = ? AND m.key = ? AND s.hlc >= ?",
                (dataset, key, floor),
            )
        }
        old = conn.execute(
            rows.SELECT_VERSIONS
            + " WHERE dataset = ? AND key = ? ORDER BY hlc DESC LIMIT -1 OFFSET ?",
            (dataset, key, self.keep_versions),
        ).fetchall()
        return self._delete_rows(conn, [row for row in old if row[2] not in pinned], "pruned")

    def _delete_rows(
        self,
        conn: sqlite3.Connection,
        victims: list[tuple[object, ...]],
        why: str,
        *,
        in_sets: bool = True,
    ) -> list[Path]:
        """Delete these `versions` rows (SELECT_VERSIONS columns), journal each removal
        and, unless `in_sets` is False (their dataset has no version set), recompute
        the sets naming them; return their files, to remove after commit."""
        if not victims:
            return []
        paths: list[Path] = []
        gone: list[tuple[str, str, str]] = []
        journal: list[rows.JournalRow] = []
        at_ms = rows.now_ms()
        for row in victims:
            stored = rows.to_stored(row[:-1])
            hlc = stored.version.hlc.text
            gone.append((stored.dataset, stored.key, hlc))
            data = rows.version_data(stored.version)
            data["reason"] = why
            journal.append(
                rows.journal_row("removed", stored.dataset, stored.key, hlc, data, at_ms)
            )
            if row[-1] is not None:
                paths.append(self.root / str(row[-1]))
        conn.executemany("DELETE FROM versions WHERE dataset = ? AND key = ? AND hlc = ?", gone)
        rows.journal_many(conn, journal)
        if in_sets:
            for dataset, key, hlc in gone:
                rows.refresh_sets_of(conn, dataset, key, hlc)
        return paths

    def _remove_files(self, paths: list[Path]) -> None:
        for path in paths:
            files.remove_file(path)

    def _settle(self, completed: Iterable[tuple[str, str]]) -> None:
        """Prune for each set that just became complete (no object lock held: it takes
        them one at a time, so two threads never wait on each other's)."""
        for dataset, set_id in completed:
            self._prune_set_keys(dataset, set_id)

    def _prune_set_keys(self, dataset: str, set_id: str) -> None:
        """A set just became complete: the sets before it no longer pin their members,
        so prune every key it names."""
        with self._lock:
            keys = [
                row[0]
                for row in self._db.execute(
                    "SELECT key FROM set_members WHERE dataset = ? AND set_id = ?",
                    (dataset, set_id),
                )
            ]
        for key in keys:
            with self._object_lock(dataset, key):
                with self._tx() as conn:
                    victims = self._prune_rows(conn, dataset, key)
                self._remove_files(victims)
        with self._tx() as conn:
            self._drop_superseded_sets(conn, dataset)

    def _drop_superseded_sets(self, conn: sqlite3.Connection, dataset: str) -> list[str]:
        """Forget the sets of `dataset` that can never be shown again, by name or as the
        latest: older than its newest complete set, and lacking a member that cannot
        arrive any more (no row of it here, and a newer version of its key held: pruned,
        or kept out by last writer wins). Kept, they would pile up one per checkpoint.
        A set whose members are still on their way, or marked missing (a repair may
        restore them), stays; so does one still complete, readable by name, until
        pruning takes a member. Each leaves its id and HLC in `sets_dropped`. Returns
        the ids dropped."""
        floor = rows.set_floor(conn, dataset)
        if floor is None:
            return []
        gone = conn.execute(
            "SELECT s.set_id, s.hlc FROM sets AS s"
            " WHERE s.dataset = ? AND s.complete = 0 AND s.hlc < ? AND EXISTS ("
            "  SELECT 1 FROM set_members AS m"
            "  WHERE m.dataset = s.dataset AND m.set_id = s.set_id"
            "  AND NOT EXISTS (SELECT 1 FROM versions AS v"
            "   WHERE v.dataset = m.dataset AND v.key = m.key AND v.hlc = m.hlc)"
            "  AND EXISTS (SELECT 1 FROM versions AS w"
            "   WHERE w.dataset = m.dataset AND w.key = m.key AND w.hlc > m.hlc))",
            (dataset, floor),
        ).fetchall()
        self._forget_sets(conn, dataset, gone, "superseded")
        return [str(set_id) for set_id, _ in gone]

    @staticmethod
    def _forget_sets(
        conn: sqlite3.Connection, dataset: str, gone: Sequence[tuple[str, str]], reason: str
    ) -> None:
        """Delete these sets (id, HLC) with their members, keep each id and HLC in
        `sets_dropped` and journal `set_removed`."""
        for set_id, hlc in gone:
            conn.execute(
                "DELETE FROM set_members WHERE dataset = ? AND set_id = ?", (dataset, set_id)
            )
            conn.execute("DELETE FROM sets WHERE dataset = ? AND set_id = ?", (dataset, set_id))
            conn.execute(
                "INSERT INTO sets_dropped (dataset, set_id, hlc) VALUES (?, ?, ?)"
                " ON CONFLICT (dataset, set_id) DO UPDATE SET hlc = max(hlc, excluded.hlc)",
                (dataset, set_id, hlc),
            )
            data: dict[str, JsonValue] = {"set": set_id, "reason": reason}
            rows.journal(conn, "set_removed", dataset, None, hlc, data)

    def expire_tombstones(
        self,
        now_ms: int | None = None,
        *,
        batch: int = EXPIRY_BATCH,
        datasets: Callable[[str], bool] | None = None,
        confirm: Callable[[str, list[tuple[str, str]]], Collection[str]] | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> int:
        """Forget objects whose newest version is a tombstone older than the retention
        (its HLC wall time), with every version they still hold, and the marks of sets
        forgotten (`sets_dropped`) as old. Only objects (and marks) of `datasets` (all
        when None), and never one a set readers may see names (`_expire_one`).
        `confirm`, when given, is asked per dataset with at most CONFIRM_BATCH of the
        candidates' (key, tombstone HLC) at a time, without the store's lock, and
        answers the keys that may go (a critical dataset's, once every agent of every
        copy region shows the delete or nothing: agents/daemon/expiry.py). Returns
        how many objects. Reads at most `batch` tombstones older than the retention at
        a time (through the `versions_deletes` index, in HLC order; those a later
        version superseded are skipped), so a pass costs what is old, not what is
        stored, and the store's lock is never held for a long scan (a sweep runs
        beside writes). `stopping`, when it says so before a batch, ends the pass there (the
        agent stops): what it forgot so far is returned, nothing more is touched."""
        if batch < 1:
            raise InvalidInputError(f"batch must be at least 1, got {batch}")
        cutoff = (rows.now_ms() if now_ms is None else now_ms) - 1000 * self.tombstone_retention_s
        # HLC text starts with its 13-digit wall time: every HLC of a wall time before
        # the cutoff sorts below these digits, and none of the cutoff's or later.
        below = f"{max(cutoff, 0):013d}"
        expired = 0
        after: tuple[str, str, str] = ("", "", "")
        while True:
            if stopping is not None and stopping():
                return expired
            with self._lock:
                self._require_open()
                # LIMIT counts tombstones read, superseded ones too (a delete a later
                # put replaced stays until pruned): a batch reads `batch` index rows.
                found = self._db.execute(
                    "SELECT v.dataset, v.key, v.hlc, EXISTS (SELECT 1 FROM versions AS n"
                    " WHERE n.dataset = v.dataset AND n.key = v.key AND n.hlc > v.hlc)"
                    " FROM versions AS v"
                    " WHERE v.op = 'delete' AND v.hlc < ? AND (v.hlc, v.dataset, v.key) > (?, ?, ?)"
                    " ORDER BY v.hlc, v.dataset, v.key LIMIT ?",
                    (below, *after, batch),
                ).fetchall()
            if not found:
                break
            after = (found[-1][2], found[-1][0], found[-1][1])
            due: dict[str, list[tuple[str, str]]] = {}
            for dataset, key, hlc, superseded in found:
                if not superseded and (datasets is None or datasets(dataset)):
                    due.setdefault(dataset, []).append((key, hlc))
            for dataset, candidates in due.items():
                # `confirm` a share at a time: one that fails or is slow keeps only it.
                for at in range(0, len(candidates), CONFIRM_BATCH):
                    if stopping is not None and stopping():
                        return expired
                    share = candidates[at : at + CONFIRM_BATCH]
                    allowed = None if confirm is None else set(confirm(dataset, share))
                    for key, hlc in share:
                        if allowed is None or key in allowed:
                            expired += self._expire_one(dataset, key, hlc)
        if stopping is not None and stopping():
            return expired
        with self._lock:
            self._require_open()
            marked = self._db.execute(
                "SELECT DISTINCT dataset FROM sets_dropped WHERE hlc < ?", (below,)
            ).fetchall()
        aged = [d for (d,) in marked if datasets is None or datasets(d)]
        with self._tx() as conn:
            conn.executemany(
                "DELETE FROM sets_dropped WHERE dataset = ? AND hlc < ?",
                [(d, below) for d in aged],
            )
        return expired

    def _expire_one(self, dataset: str, key: str, hlc: str) -> int:
        """Forget one object whose newest version was the tombstone `hlc`; 0 when it was
        written since the scan, or when a set readers may see names it (the newest
        complete set of its dataset, or a newer one: what pruning pins). Older sets
        naming it can never be whole again once it goes: they go with it."""
        with self._object_lock(dataset, key):
            with self._tx() as conn:
                newest = conn.execute(
                    "SELECT max(hlc) FROM versions WHERE dataset = ? AND key = ?",
                    (dataset, key),
                ).fetchone()[0]
                floor = rows.set_floor(conn, dataset)
                naming = rows.sets_naming(conn, dataset, key)
                if newest != hlc or any(h >= (floor or "") for _, h in naming):
                    return 0
                held = conn.execute(
                    rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ?", (dataset, key)
                ).fetchall()
                victims = self._delete_rows(conn, held, "tombstone expired")
                self._forget_sets(conn, dataset, naming, "member expired")
            self._remove_files(victims)
        return 1

    def evict(
        self,
        dataset: str,
        keys: Sequence[tuple[str, HLC]],
        proven_sets: Collection[tuple[str, str]] = (),
    ) -> Evicted:
        """Forget every version of each of `keys` (key, HLC) whose newest version here is
        that HLC or older, with the sets naming it: the copies of a dataset this region
        no longer places, each of which the caller proved held elsewhere at that version
        or newer (`meridian dataset evict`). Kept, each named with why: an object
        written here since (newer); one whose change event this store has not yet
        published (the event would name a version nobody could then send); one that a
        complete set readers may see names (this agent's newest complete set or a newer
        one, none older than the newest of `proven_sets`), unless every such set is in
        `proven_sets` (id, HLC text: shown complete elsewhere, that very record). A key
        not held is skipped. Each version is journalled `removed` (reason `evicted`), so
        the catalog forgets this region's copies, and each object goes in a transaction
        of its own, under its lock: an eviction cut short leaves every object whole or
        gone."""
        dataset = check_name("dataset", dataset)
        checked = [(check_name("key", key), at) for key, at in keys]  # all before any goes
        proven = set(proven_sets)
        for _, hlc in proven:
            # A proven set raises the floor below which no set pins (`_evict_refusal`):
            # one stamped past this clock's skew bound is no set anyone made.
            self.clock.check_skew(HLC.parse(hlc))
        objects = versions = size = 0
        kept: list[tuple[str, str]] = []
        for key, at in checked:
            with self._object_lock(dataset, key):
                with self._tx() as conn:
                    held = conn.execute(
                        rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ?", (dataset, key)
                    ).fetchall()
                    if not held:
                        continue
                    why = self._evict_refusal(conn, dataset, key, held, at, proven)
                    if why is not None:
                        kept.append((key, why))
                        continue
                    naming = rows.sets_naming(conn, dataset, key)
                    paths = self._delete_rows(conn, held, EVICTED)
                    self._forget_sets(conn, dataset, naming, "member evicted")
                self._remove_files(paths)
            objects += 1
            versions += len(held)
            size += sum(int(row[4] or 0) for row in held if row[3] == "put")
        return Evicted(objects, versions, size, tuple(kept))

    @staticmethod
    def _evict_refusal(
        conn: sqlite3.Connection,
        dataset: str,
        key: str,
        held: list[tuple[object, ...]],
        at: HLC,
        proven: set[tuple[str, str]],
    ) -> str | None:
        """Why `evict` keeps this object (None: it may go); see there."""
        newest = max(str(row[2]) for row in held)
        if newest > at.text:
            return f"written here since ({newest}, newer than {at.text})"
        if conn.execute(
            "SELECT 1 FROM outbox WHERE dataset = ? AND key = ? LIMIT 1", (dataset, key)
        ).fetchone():
            return "its change event is not yet published from here"
        # In a region of several agents, sets stay on the agent that took them and
        # readers see the newest complete one of all: a proven set newer than this
        # agent's own newest is the floor (else an agent whose newest is older would
        # keep those members at every run). A set this agent holds incomplete is shown
        # to nobody and cannot complete once a member goes: it pins nothing. (Nothing
        # sends this region copies once it is out of the placement, so a set waiting
        # for a member, or for a lost member's bytes to be restored, would wait for
        # good; the placement holds the versions it names, each proven.)
        floor = max([rows.set_floor(conn, dataset) or "", *(hlc for _, hlc in proven)])
        visible = sorted(
            set_id
            for set_id, hlc in rows.sets_naming(conn, dataset, key, complete_only=True)
            if hlc >= floor and (set_id, hlc) not in proven
        )
        if visible:
            return f"named by version set {visible[0]}, not shown complete elsewhere"
        return None

    # -- reads -----------------------------------------------------------------------

    def open(
        self,
        dataset: str,
        key: str,
        version: HLC | str | None = None,
        *,
        set_id: str | None = None,
    ) -> ObjectReader:
        """Open the newest version (or the given one, or with `set_id` -- a set id or
        "latest" -- the member's version in that set) for reading. NotFoundError when
        it is not held or is a tombstone; MissingContentError when its bytes were lost."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        hlc = HLC.parse(version) if isinstance(version, str) else version
        with self._lock:  # re-entrant: the set and its member read as one (no prune between)
            if set_id is not None and hlc is None:
                record = self.get_set(dataset, set_id)
                hlc = record.members.get(key)
                if hlc is None:
                    raise NotFoundError(f"set {record.set_id} of {dataset} has no member {key}")
            self._require_open()
            stored = self._row(dataset, key, hlc) if hlc is not None else self._newest(dataset, key)
            if stored is None:
                what = f"version {hlc} of object" if hlc is not None else "object"
                raise NotFoundError(f"{what} {dataset}/{key} is not stored here")
            if stored.version.is_tombstone:
                raise DeletedError(
                    f"object {dataset}/{key} was deleted (tombstone {stored.version.hlc})"
                )
            if stored.state == "missing":
                raise _missing(stored)
            reader = self._open_held(stored)
            if reader is None:
                raise _missing(stored)
        return reader

    def _open_held(self, stored: StoredVersion) -> ObjectReader | None:
        """A present put version's reader: its inline bytes, else its file; None when
        its file is gone (the store's lock held)."""
        dataset, key, hlc = stored.dataset, stored.key, stored.version.hlc
        found = self._db.execute(
            "SELECT data FROM inline_bytes WHERE dataset = ? AND key = ? AND hlc = ?",
            (dataset, key, hlc.text),
        ).fetchone()
        if found is not None:
            return InlineReader(stored, bytes(found[0]))
        try:
            fd = os.open(self.root / version_path(dataset, key, hlc), os.O_RDONLY)
        except FileNotFoundError:
            return None
        return ObjectReader(stored, fd)

    def open_many(
        self, items: Sequence[tuple[str, str, HLC]]
    ) -> list[ObjectReader | NotFoundError | MissingContentError]:
        """`open` of given versions of many objects (a bundle's), with one lookup per
        dataset and `rows.LOOKUP_KEYS` keys instead of one per object; per item its
        reader or the error `open` would raise. Each (dataset, key) at most once."""
        names = [(check_name("dataset", d), check_name("key", k)) for d, k, _ in items]
        self._distinct(names)
        out: list[ObjectReader | NotFoundError | MissingContentError] = []
        with self._lock:  # files are opened under it, as in `open`: never a pruned one
            found = self._held_many(names)
            for (dataset, key), (_, _, hlc) in zip(names, items, strict=True):
                stored = _at(found.get((dataset, key), ()), hlc)
                if stored is None or stored.version.is_tombstone:
                    out.append(
                        NotFoundError(f"version {hlc} of object {dataset}/{key} is not stored here")
                    )
                    continue
                if stored.state == "missing":
                    out.append(_missing(stored))
                    continue
                reader = self._open_held(stored)
                out.append(_missing(stored) if reader is None else reader)
        return out

    def heads(self, names: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Version]:
        """`head` of many objects at once (those holding no version are left out)."""
        checked = [(check_name("dataset", d), check_name("key", k)) for d, k in names]
        return {name: rows_[0].version for name, rows_ in self._held_many(checked).items()}

    def read_bytes(self, dataset: str, key: str, version: HLC | str | None = None) -> bytes:
        """The whole content of a version (for small objects and tests)."""
        with self.open(dataset, key, version) as reader:
            return reader.read_all()

    def head(self, dataset: str, key: str) -> Version | None:
        """The newest version held (a put or a tombstone), for LWW decisions; None if none."""
        stored = self._newest(check_name("dataset", dataset), check_name("key", key))
        return None if stored is None else stored.version

    def stat(
        self,
        dataset: str,
        key: str,
        version: HLC | str | None = None,
        *,
        include_deleted: bool = False,
    ) -> StoredVersion:
        """The newest version of an object (or the given one). NotFoundError when none is
        held, or when it is a tombstone unless `include_deleted`."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        if version is not None:
            hlc = HLC.parse(version) if isinstance(version, str) else version
            stored = self._row(dataset, key, hlc)
        else:
            stored = self._newest(dataset, key)
        if stored is None:
            raise NotFoundError(f"object {dataset}/{key} is not stored here")
        if stored.version.is_tombstone and not include_deleted:
            raise DeletedError(
                f"object {dataset}/{key} was deleted (tombstone {stored.version.hlc})"
            )
        return stored

    def versions(self, dataset: str, key: str) -> list[StoredVersion]:
        """Every version held of an object (bases and tombstones), newest first."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        with self._lock:
            self._require_open()
            found = self._db.execute(
                rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ? ORDER BY hlc DESC",
                (dataset, key),
            ).fetchall()
        return [rows.to_stored(row[:-1]) for row in found]

    def list_objects(
        self,
        dataset: str,
        prefix: str = "",
        *,
        cursor: str | None = None,
        limit: int = 1000,
        include_deleted: bool = False,
    ) -> Page:
        """Objects of a dataset whose key starts with `prefix`, in key order, each with its
        newest version; at most `limit` per page. Pass the page's `cursor` back for
        the next page (None: this was the last; a full page is only given a cursor
        when another object follows it)."""
        dataset = check_name("dataset", dataset)
        if prefix:
            check_name("prefix", prefix)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidInputError(f"cursor must be text from a previous page, got {cursor!r}")
        after = cursor or ""
        items: list[StoredVersion] = []
        batch = limit + 1
        while True:  # each pass moves `after` forward, and the key space is finite
            with self._lock:
                self._require_open()
                found = self._db.execute(
                    # With one max(), SQLite takes the bare columns from the row holding it.
                    "SELECT dataset, key, max(hlc), op, size, digest, state, set_id, stored_ms"
                    " FROM versions WHERE dataset = ? AND key > ? AND key >= ?"
                    " GROUP BY key ORDER BY key LIMIT ?",
                    (dataset, after, prefix, batch),
                ).fetchall()
            for row in found:
                stored = rows.to_stored(row)
                if not stored.key.startswith(prefix):
                    return Page(items, None)
                after = stored.key
                if stored.version.is_tombstone and not include_deleted:
                    continue
                if len(items) == limit:  # one more exists: the page is full, not the last
                    return Page(items, items[-1].key)
                items.append(stored)
            if len(found) < batch:
                return Page(items, None)

    def listing(
        self, dataset: str, after: str = "", limit: int = 1000
    ) -> list[tuple[str, str, str | None]]:
        """(key, newest HLC text, content digest text or None) of each object of `dataset`
        whose key sorts after `after`, in key order, tombstones included, at most
        `limit`: `list_objects(include_deleted=True)` as the stored text, without a
        StoredVersion per row (the holdings publisher, agents/daemon/holdings.py, lists
        every critical dataset whenever anything changed; the objects were most of it)."""
        dataset = check_name("dataset", dataset)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidInputError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
        with self._lock:
            self._require_open()
            found = self._db.execute(
                # With one max(), SQLite takes the bare columns from the row holding it.
                "SELECT key, max(hlc), digest FROM versions WHERE dataset = ? AND key > ?"
                " GROUP BY key ORDER BY key LIMIT ?",
                (dataset, after, limit),
            ).fetchall()
        # The columns are TEXT NOT NULL but for digest: sqlite3 gives them as str and
        # None already (the rows are what is returned: no copy of a list this long).
        return cast("list[tuple[str, str, str | None]]", found)

    def held(self, after: tuple[str, str] | None = None, limit: int = 1000) -> list[StoredVersion]:
        """The newest version (puts and tombstones) of each object held, in (dataset,
        key) order, at most `limit`, after the object `after` (issue 16: the rebalance
        walks the store with it). Its `set_id` is that of the newest version or, when
        that was written in none, of an older version a set names or that was written
        in one: the rebalance leaves all of those where they are (`hand_off`)."""
        d, k = after if after is not None else ("", "")
        with self._lock:
            self._require_open()
            found = self._db.execute(
                # With one max(), SQLite takes the bare columns from the row holding it.
                "SELECT dataset, key, max(hlc), op, size, digest, state, coalesce(set_id,"
                " (SELECT m.set_id FROM set_members AS m"
                "  WHERE m.dataset = versions.dataset AND m.key = versions.key LIMIT 1),"
                " (SELECT o.set_id FROM versions AS o WHERE o.dataset = versions.dataset"
                "  AND o.key = versions.key AND o.set_id IS NOT NULL LIMIT 1)), stored_ms"
                " FROM versions WHERE (dataset, key) > (?, ?)"
                " GROUP BY dataset, key ORDER BY dataset, key LIMIT ?",
                (d, k, limit),
            ).fetchall()
        return [rows.to_stored(row) for row in found]

    def hand_off(self, dataset: str, key: str, newest: HLC) -> bool:
        """Forget every version of an object once other agents of the region hold it
        (issue 16: a rebalance moved it), if `newest` is still the newest held; returns
        whether it was forgotten. No journal record: the region still holds the object
        (on its new owners), so the catalog's view of the region does not change.
        Never an object a version set names, or one with a version written in a set,
        whichever version is the newest: a set's members stay on the agent that shows
        the set (a plain overwrite of a member's key must not take the member along)."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        with self._object_lock(dataset, key):
            with self._tx() as conn:
                held = conn.execute(
                    rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ? ORDER BY hlc DESC",
                    (dataset, key),
                ).fetchall()
                if not held or held[0][2] != newest.text:
                    return False
                if _named_by_a_set(conn, dataset, key) or any(row[7] is not None for row in held):
                    return False
                paths: list[Path] = []
                for row in held:
                    conn.execute(
                        "DELETE FROM versions WHERE dataset = ? AND key = ? AND hlc = ?",
                        (dataset, key, row[2]),
                    )
                    if row[-1] is not None:
                        paths.append(self.root / str(row[-1]))
            self._remove_files(paths)
        return True

    def rewind(self, dataset: str, key: str, version: Version) -> bool:
        """Drop one version of a critical object that was never acknowledged (issue 14:
        a deposed owner's write, refused by the replicas under a newer epoch); the
        previous version, if any, is the newest again. Journalled `removed` (reason
        `rewound`), so the catalog forgets this region's copy. Returns whether it was
        held (with that digest: another write at the same HLC is not this one)."""
        dataset, key = check_name("dataset", dataset), check_name("key", key)
        with self._object_lock(dataset, key):
            with self._tx() as conn:
                row = conn.execute(
                    rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ? AND hlc = ?",
                    (dataset, key, version.hlc.text),
                ).fetchone()
                if row is None or rows.to_stored(row[:-1]).version.digest != version.digest:
                    return False
                paths = self._delete_rows(conn, [row], "rewound")
            self._remove_files(paths)
        log.info(
            "version_rewound", dataset=dataset, key=key, version=version.hlc.text, files=len(paths)
        )
        return True

    def usage(self) -> Usage:
        """Objects whose newest version is a put, version files kept, their bytes (counters
        kept by triggers, see schema.py: no scan), and the space left on the root's
        file system."""
        with self._lock:
            self._require_open()
            objects, versions, size = self._db.execute(
                "SELECT objects, versions, bytes FROM usage WHERE id = 1"
            ).fetchone()
            fs = os.statvfs(self.root)
        return Usage(
            objects=objects, versions=versions, bytes=size, bytes_free=fs.f_bavail * fs.f_frsize
        )

    def _newest(self, dataset: str, key: str) -> StoredVersion | None:
        with self._lock:
            self._require_open()
            row = self._db.execute(
                rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ? ORDER BY hlc DESC LIMIT 1",
                (dataset, key),
            ).fetchone()
        return None if row is None else rows.to_stored(row[:-1])

    def _set_needs(self, dataset: str, key: str, version: Version, set_id: str | None) -> bool:
        """Whether `version`, older than the newest held of its key, is still a member
        this store must hold: `set_id`, recorded here and not yet complete (nor
        superseded by a newer complete one), names exactly it. A replica that was cut
        off while the set was written got a later version of the key first (the next
        checkpoint's); by LWW alone it could never complete the set, its catch-up
        would never end, and its readers would see the set before it for good. Stored
        as an older row (pinned by the set), the newest stays the newest."""
        if set_id is None or version.is_tombstone:
            return False
        with self._lock:
            self._require_open()
            floor = rows.set_floor(self._db, dataset) or ""
            found = self._db.execute(
                "SELECT 1 FROM sets AS s JOIN set_members AS m"
                " ON s.dataset = m.dataset AND s.set_id = m.set_id"
                " WHERE s.dataset = ? AND s.set_id = ? AND s.complete = 0 AND s.hlc >= ?"
                " AND m.key = ? AND m.hlc = ?",
                (dataset, set_id, floor, key, version.hlc.text),
            ).fetchone()
        return found is not None

    def _row(self, dataset: str, key: str, hlc: HLC) -> StoredVersion | None:
        with self._lock:
            self._require_open()
            row = self._db.execute(
                rows.SELECT_VERSIONS + " WHERE dataset = ? AND key = ? AND hlc = ?",
                (dataset, key, hlc.text),
            ).fetchone()
        return None if row is None else rows.to_stored(row[:-1])

    # -- version sets ----------------------------------------------------------------

    def commit_set(
        self,
        dataset: str,
        set_id: str,
        members: Mapping[str, HLC | str],
        *,
        outbox: bool = False,
        epoch: int = 0,
        policy_revision: int | None = None,
    ) -> SetRecord:
        """Commit a version set written here: every member (key → version) must be stored
        (NotFoundError names the first that is not). It gets a fresh HLC and is
        visible at once; `outbox=True` adds its change event in the same transaction."""
        dataset, set_id, parsed = self._check_set(dataset, set_id, members)
        if outbox:
            # Its change event names every member: one Kafka cannot take is refused now,
            # not acked and then never replicated.
            size = len(dataset) + len(set_id) + sum(len(k.encode()) + 40 for k in parsed) + 512
            if size > MAX_EVENT_BYTES:
                raise InvalidInputError(
                    f"set {set_id} of {dataset} names {len(parsed)} members: its change "
                    f"event (about {size} bytes) is over the change log's {MAX_EVENT_BYTES}-"
                    "byte limit; split it into smaller sets"
                )
        with self._tx() as conn:
            for key, hlc in parsed.items():
                found = conn.execute(
                    "SELECT op, state FROM versions WHERE dataset = ? AND key = ? AND hlc = ?",
                    (dataset, key, hlc.text),
                ).fetchone()
                if found is None or found[0] != "put" or found[1] != "present":
                    raise NotFoundError(
                        f"set {set_id} of {dataset} names {key} at {hlc}, which is not stored here"
                    )
            hlc = self.clock.now()
            self._write_set(conn, dataset, set_id, hlc, parsed)
            if outbox:
                self._add_event(
                    conn,
                    "set",
                    dataset,
                    None,
                    None,
                    set_id,
                    epoch,
                    policy_revision,
                    set_hlc=hlc,
                    members=parsed,
                )
        self._prune_set_keys(dataset, set_id)
        return SetRecord(dataset, set_id, hlc, parsed, complete=True)

    def apply_set(
        self, dataset: str, set_id: str, hlc: HLC, members: Mapping[str, HLC | str]
    ) -> Verdict:
        """Apply a set made elsewhere (last set wins per set id, by HLC): recorded now,
        visible once every member is stored here."""
        dataset, set_id, parsed = self._check_set(dataset, set_id, members)
        self.clock.observe(hlc)
        with self._tx() as conn:
            held = conn.execute(
                "SELECT hlc FROM sets WHERE dataset = ? AND set_id = ?", (dataset, set_id)
            ).fetchone()
            if held is not None and hlc.text <= held[0]:
                if hlc.text < held[0]:
                    return Verdict.OLDER
                same = self._members(conn, dataset, set_id) == parsed
                return Verdict.SAME if same else Verdict.COLLISION
            if held is None:
                dropped = conn.execute(
                    "SELECT hlc FROM sets_dropped WHERE dataset = ? AND set_id = ?",
                    (dataset, set_id),
                ).fetchone()
                # Strictly older only: the same definition again is judged afresh below
                # (a rewind, hand-off or tombstone expiry may have removed the newer
                # version that kept a member out, and it can be whole now).
                if dropped is not None and hlc.text < dropped[0]:
                    return Verdict.OLDER
            complete = self._write_set(conn, dataset, set_id, hlc, parsed)
            # Older than the newest complete set and not complete: superseded, never to
            # be shown (a replay of a set forgotten here, or one that came after its
            # successor, whose members a newer version of each key keeps out).
            if not complete and set_id in self._drop_superseded_sets(conn, dataset):
                return Verdict.OLDER
        if complete:
            self._prune_set_keys(dataset, set_id)
        return Verdict.APPLY

    def get_set(self, dataset: str, set_id: str = "latest") -> SetRecord:
        """`latest`: the complete set with the highest HLC (readers never see one with a
        member missing: they see the one before). A named set: NotFoundError if
        unknown, UnavailableError (retriable) while members are still missing."""
        dataset = check_name("dataset", dataset)
        with self._lock:
            self._require_open()
            if set_id == "latest":
                row = self._db.execute(
                    "SELECT set_id, hlc, complete FROM sets WHERE dataset = ? AND complete = 1"
                    " ORDER BY hlc DESC LIMIT 1",
                    (dataset,),
                ).fetchone()
                if row is None:
                    raise NotFoundError(f"dataset {dataset} has no complete version set here")
            else:
                set_id = check_name("set", set_id)
                row = self._db.execute(
                    "SELECT set_id, hlc, complete FROM sets WHERE dataset = ? AND set_id = ?",
                    (dataset, set_id),
                ).fetchone()
                if row is None:
                    raise NotFoundError(f"set {set_id} of {dataset} is not known here")
            members = self._members(self._db, dataset, row[0])
            if not row[2]:
                held = sum(1 for k, h in members.items() if self._present(dataset, k, h))
                raise UnavailableError(
                    f"set {row[0]} of {dataset} has {held} of its {len(members)} members "
                    "stored here; it becomes visible once all are"
                )
        return SetRecord(dataset, row[0], HLC.parse(row[1]), members, complete=True)

    def missing_members(self, dataset: str, set_id: str) -> list[str]:
        """The member keys of a recorded set that are not stored here at the set's
        version (empty: the set is complete, hence visible); NotFoundError if the set
        is not recorded here."""
        dataset, set_id = check_name("dataset", dataset), check_name("set", set_id)
        with self._lock:
            self._require_open()
            if (
                self._db.execute(
                    "SELECT 1 FROM sets WHERE dataset = ? AND set_id = ?", (dataset, set_id)
                ).fetchone()
                is None
            ):
                raise NotFoundError(f"set {set_id} of {dataset} is not known here")
            members = self._members(self._db, dataset, set_id)
            return [k for k, h in members.items() if not self._present(dataset, k, h)]

    def holds_sets(self) -> bool:
        """Whether any version set is recorded here (complete or not), or any member of
        one whose set is not yet: its members stay on this agent alone (a rebalance does
        not move them), so this agent holds the region's only copy of them."""
        with self._lock:
            self._require_open()
            for sql in (
                "SELECT 1 FROM sets LIMIT 1",
                "SELECT 1 FROM versions WHERE set_id IS NOT NULL LIMIT 1",
            ):
                if self._db.execute(sql).fetchone() is not None:
                    return True
            return False

    def list_sets(self, dataset: str) -> list[SetRecord]:
        """Every set recorded for a dataset, complete or not, newest first."""
        dataset = check_name("dataset", dataset)
        with self._lock:
            self._require_open()
            found = self._db.execute(
                "SELECT set_id, hlc, complete FROM sets WHERE dataset = ? ORDER BY hlc DESC",
                (dataset,),
            ).fetchall()
            return [
                SetRecord(dataset, s, HLC.parse(h), self._members(self._db, dataset, s), bool(done))
                for s, h, done in found
            ]

    def _check_set(
        self, dataset: str, set_id: str, members: Mapping[str, HLC | str]
    ) -> tuple[str, str, dict[str, HLC]]:
        dataset, set_id = check_name("dataset", dataset), check_name("set", set_id)
        if set_id == "latest":
            raise InvalidInputError("set 'latest' is reserved; it names the newest complete set")
        if not members:
            raise InvalidInputError(f"set {set_id} of {dataset} has no members")
        parsed = {
            check_name("key", key): HLC.parse(hlc) if isinstance(hlc, str) else hlc
            for key, hlc in members.items()
        }
        return dataset, set_id, parsed

    def _write_set(
        self,
        conn: sqlite3.Connection,
        dataset: str,
        set_id: str,
        hlc: HLC,
        members: Mapping[str, HLC],
    ) -> bool:
        conn.execute("DELETE FROM set_members WHERE dataset = ? AND set_id = ?", (dataset, set_id))
        conn.execute(
            "INSERT INTO sets (dataset, set_id, hlc, complete, stored_ms) VALUES (?, ?, ?, 0, ?)"
            " ON CONFLICT (dataset, set_id) DO UPDATE SET hlc = excluded.hlc,"
            " stored_ms = excluded.stored_ms",
            (dataset, set_id, hlc.text, rows.now_ms()),
        )
        conn.executemany(
            "INSERT INTO set_members (dataset, set_id, key, hlc) VALUES (?, ?, ?, ?)",
            [(dataset, set_id, key, member.text) for key, member in members.items()],
        )
        rows.journal(
            conn,
            "set",
            dataset,
            None,
            hlc.text,
            {"set": set_id, "members": {k: v.text for k, v in members.items()}},
        )
        return rows.refresh_set(conn, dataset, set_id)

    @staticmethod
    def _members(conn: sqlite3.Connection, dataset: str, set_id: str) -> dict[str, HLC]:
        return {
            key: HLC.parse(hlc)
            for key, hlc in conn.execute(
                "SELECT key, hlc FROM set_members WHERE dataset = ? AND set_id = ? ORDER BY key",
                (dataset, set_id),
            )
        }

    def _present(self, dataset: str, key: str, hlc: HLC) -> bool:
        row = self._row(dataset, key, hlc)
        return row is not None and row.state == "present"

    # -- outbox and journal ----------------------------------------------------------

    def outbox_pending(
        self, limit: int = 100, *, kind: Literal["version", "set"] | None = None
    ) -> list[OutboxEvent]:
        """The oldest change events not yet published, in commit order (of one `kind`
        only, when given)."""
        with self._lock:
            self._require_open()
            found = self._db.execute(
                "SELECT seq, event_id, kind, dataset, key, hlc, op, size, digest, set_id,"
                " members, origin_region, epoch, policy_revision FROM outbox"
                " WHERE ?1 IS NULL OR kind = ?1 ORDER BY seq LIMIT ?2",
                (kind, limit),
            ).fetchall()
        return [_event(row) for row in found]

    def outbox_count(self, *, kind: Literal["version", "set"] | None = None) -> int:
        """How many change events (of one `kind`, when given) wait to be published."""
        with self._lock:
            self._require_open()
            row = self._db.execute(
                "SELECT count(*) FROM outbox WHERE ?1 IS NULL OR kind = ?1", (kind,)
            ).fetchone()
        return int(row[0])

    def outbox_oldest_ms(self) -> int | None:
        """When the oldest change event still waiting was committed (ms), None if none."""
        with self._lock:
            self._require_open()
            row = self._db.execute("SELECT created_ms FROM outbox ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def outbox_published(self, event_ids: Iterable[str]) -> None:
        """Forget events once Kafka acknowledged them (acks=all)."""
        with self._tx() as conn:
            conn.executemany("DELETE FROM outbox WHERE event_id = ?", [(e,) for e in event_ids])

    def journal_pending(self, limit: int = 1000) -> list[JournalEntry]:
        """Journal records after the recorder's position, in commit order."""
        with self._lock:
            self._require_open()
            found = self._db.execute(
                "SELECT seq, kind, dataset, key, hlc, at_ms, data FROM journal"
                " WHERE seq > ? ORDER BY seq LIMIT ?",
                (self._cursor(), limit),
            ).fetchall()
        return [
            JournalEntry(seq, kind, ds, key, hlc, at, json.loads(data))
            for seq, kind, ds, key, hlc, at, data in found
        ]

    def journal_shipped(self, seq: int) -> None:
        """The catalog holds every record up to `seq`: move the position, drop them."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO cursors (name, seq) VALUES (?, ?) ON CONFLICT (name)"
                " DO UPDATE SET seq = max(seq, excluded.seq)",
                (RECORDER, seq),
            )
            conn.execute("DELETE FROM journal WHERE seq <= ?", (seq,))

    def change_seq(self) -> int:
        """A number that grows with every commit that changes what is held (each one
        journals a record: this is the journal's AUTOINCREMENT counter, one row read),
        so a poller can tell cheaply whether anything changed since it last looked."""
        with self._lock:
            self._require_open()
            row = self._db.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'journal'"
            ).fetchone()
        return 0 if row is None else int(row[0])

    def dataset_names(self) -> list[str]:
        """The datasets of which this store holds any version, by name."""
        with self._lock:
            self._require_open()
            found = self._db.execute("SELECT DISTINCT dataset FROM versions ORDER BY dataset")
            return [str(r[0]) for r in found.fetchall()]

    def journal_position(self) -> int:
        """The seq of the last record the catalog holds (0 at first)."""
        with self._lock:
            return self._cursor()

    def _cursor(self) -> int:
        row = self._db.execute("SELECT seq FROM cursors WHERE name = ?", (RECORDER,)).fetchone()
        return 0 if row is None else int(row[0])

    # -- locking ---------------------------------------------------------------------

    @contextmanager
    def _object_lock(self, dataset: str, key: str) -> Iterator[None]:
        with self._stripes[stripe_of(dataset, key)]:
            yield

    @contextmanager
    def _object_locks(self, names: Iterable[tuple[str, str]]) -> Iterator[None]:
        """The locks of several objects, taken in stripe order so that two bundles
        never wait on each other."""
        stripes = sorted({stripe_of(*name) for name in names})
        with ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._stripes[stripe])
            yield

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._require_open()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as err:
                raise StorageError(
                    f"the metadata database of store {self.root} failed: {err}"
                ) from err

    def _require_open(self) -> None:
        if self._closed:
            raise UnavailableError(f"store {self.root} is closed")


def _named_by_a_set(conn: sqlite3.Connection, dataset: str, key: str) -> bool:
    """Whether a recorded version set names a version of this object."""
    return (
        conn.execute(
            "SELECT 1 FROM set_members WHERE dataset = ? AND key = ? LIMIT 1", (dataset, key)
        ).fetchone()
        is not None
    )


def _raise_first(errors: Sequence[BaseException | None]) -> None:
    """Raise the first error of parallel jobs (in job order), once all have ended."""
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def stripe_of(dataset: str, key: str) -> int:
    """The object lock stripe of a name: a CRC of it, not `hash()`, so that which writers
    share a stripe is the same in every process (Python salts str hashes per process)."""
    return zlib.crc32(f"{dataset}\0{key}".encode()) % _STRIPES


def _any_file(folder: Path) -> bool:
    return any(names for _, _, names in os.walk(folder))


def _missing(stored: StoredVersion) -> MissingContentError:
    return MissingContentError(
        f"the bytes of {stored.dataset}/{stored.key} at {stored.version.hlc} are missing "
        "here; re-sync them from another region"
    )


def _chunks(source: Source) -> Iterator[bytes | bytearray | memoryview]:
    read = getattr(source, "read", None)
    if callable(read):
        while chunk := read(CHUNK_BYTES):
            yield chunk
        return
    if isinstance(source, bytes | bytearray | memoryview):
        raise InvalidInputError("a source is an iterable of chunks or a file object, not bytes")
    yield from source


def _event(row: tuple[object, ...]) -> OutboxEvent:
    (seq, event_id, kind, ds, key, hlc, op, size, digest, set_id, members, origin, epoch, rev) = row
    if kind == "version":
        version: Version | None = Version(
            HLC.parse(hlc),
            op,  # type: ignore[arg-type]
            size,  # type: ignore[arg-type]
            None if digest is None else Digest.parse(digest),
        )
        parsed: dict[str, HLC] = {}
        set_hlc = None
    else:
        version = None
        parsed = {k: HLC.parse(v) for k, v in json.loads(str(members)).items()}
        set_hlc = HLC.parse(hlc)
    return OutboxEvent(
        seq=int(seq),  # type: ignore[call-overload]
        event_id=str(event_id),
        kind=kind,  # type: ignore[arg-type]
        dataset=str(ds),
        key=None if key is None else str(key),
        version=version,
        set_id=None if set_id is None else str(set_id),
        origin_region=str(origin),
        epoch=int(epoch),  # type: ignore[call-overload]
        policy_revision=None if rev is None else int(rev),  # type: ignore[call-overload]
        members=parsed,
        set_hlc=set_hlc,
    )


def _at(found: Sequence[StoredVersion], hlc: HLC) -> StoredVersion | None:
    """The row of version `hlc` among an object's rows (see `_held_many`)."""
    for r in found:  # a loop, not next(genexpr): most objects of a bundle have no rows
        if r.version.hlc == hlc:
            return r
    return None


def _newest_stamp(db: sqlite3.Connection) -> HLC | None:
    """The newest HLC the store holds: of its versions, its sets and the sets it dropped
    (HLC text sorts). One scan at open. An unreadable one is logged and left out (it
    breaks reads of its own object, not the store's opening)."""
    found = [
        row[0]
        for table in ("versions", "sets", "sets_dropped")
        for row in db.execute(f"SELECT max(hlc) FROM {table}")  # noqa: S608 - fixed names
        if row[0] is not None
    ]
    if not found:
        return None
    try:
        return HLC.parse(max(found))
    except HLCError as exc:
        log.error("store_newest_stamp_unreadable", error=str(exc))
        return None


def _small(source: Source) -> bytes | bytearray | memoryview | None:
    """The bytes of an applied put to keep inline: one chunk at hand of at most
    `INLINE_MAX_BYTES` (an inline change event's), else None (staged in a file)."""
    if (
        isinstance(source, list | tuple)
        and len(source) == 1
        and isinstance(source[0], bytes | bytearray | memoryview)
        and memoryview(source[0]).nbytes <= INLINE_MAX_BYTES
    ):
        return source[0]
    return None


def _wanted_in(found: Sequence[StoredVersion], version: Version) -> bool:
    """`_wanted` on rows already read: LWW would apply `version`, or it restores."""
    row = _at(found, version.hlc)
    if row is not None:
        return row.state == "missing" and row.version == version
    return lww(version, found[0].version if found else None).applies
