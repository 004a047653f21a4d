"""A write in progress: bytes streamed into a temporary file under `tmp/`, hashed in
the same pass, checked against the stated size and digest, then fsynced.

The temporary file is invisible to readers (they only open files named by a
committed metadata row), so an aborted or crashed write leaves nothing visible;
startup removes what a crash left in `tmp/`.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from pathlib import Path
from typing import Self

from agents.store import files
from agents.store.errors import (
    DigestMismatchError,
    ShortStreamError,
    StorageError,
    TooLargeError,
)
from controlplane.domain.version import ContentHasher, Digest
from controlplane.errors import InvalidInputError

TMP = "tmp"
HOLE_MIN_BYTES = 64 * 1024  # a zero chunk at least this long is left as a hole

# Temporary names: one random prefix per process and a counter, rather than a uuid4 (an
# os.urandom call) per write; the process id keeps a forked child apart, and O_EXCL
# refuses a clash whatever happens. Startup empties tmp/, so names need not outlive it.
_TMP_PREFIX = uuid.uuid4().hex[:16]
_tmp_seq = itertools.count()


def temporary_name() -> str:
    return f"{_TMP_PREFIX}-{os.getpid()}-{next(_tmp_seq)}.part"


def _all_zero(view: memoryview) -> bool:
    # First and last byte first: random data fails there at once; only a likely-zero
    # chunk pays for the full comparison (C memcmp on bytes).
    n = len(view)
    return n >= HOLE_MIN_BYTES and view[0] == 0 and view[-1] == 0 and view.tobytes() == bytes(n)


def checked_bytes(
    dataset: str,
    key: str,
    view: memoryview,
    *,
    expected_size: int,
    expected_digest: Digest | None,
) -> Digest:
    """The digest of a whole object at hand, checked against its stated size and digest
    with the errors a staged write raises (`StagedWrite.of_bytes`, and the store's
    inline versions, which are never staged)."""
    size = len(view)
    if size > expected_size:
        raise TooLargeError(
            f"object {dataset}/{key} passed its stated size of {expected_size} bytes; "
            "nothing was stored"
        )
    if size < expected_size:
        raise ShortStreamError(
            f"object {dataset}/{key} ended after {size} of its {expected_size} bytes; "
            "nothing was stored"
        )
    hasher = ContentHasher()
    hasher.update(view)
    digest = hasher.digest()
    if expected_digest is not None and digest != expected_digest:
        raise DigestMismatchError(
            f"object {dataset}/{key} hashed to {digest}, not the stated "
            f"{expected_digest}; nothing was stored"
        )
    return digest


class StagedWrite:
    """Bytes of one object on their way in. `write` each chunk, then the store commits
    it (`ObjectStore.commit_put` / `commit_apply`); `abort`, or leaving the `with`
    block without a commit, removes the temporary file. Not shared between threads."""

    def __init__(
        self,
        root: Path,
        dataset: str,
        key: str,
        *,
        expected_size: int | None = None,
        max_size: int | None = None,
        expected_digest: Digest | None = None,
        path: Path | None = None,
        resume_offset: int = 0,
    ) -> None:
        for name, value in (("expected_size", expected_size), ("max_size", max_size)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidInputError(f"{name} must be an integer >= 0, got {value!r}")
        self._fields(
            dataset,
            key,
            expected_size,
            max_size,
            expected_digest,
            path if path is not None else root / TMP / temporary_name(),
        )
        flags = os.O_RDWR | os.O_CREAT if path is not None else os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self._open(flags)
        if path is not None:
            self._continue(resume_offset)

    def _fields(
        self,
        dataset: str,
        key: str,
        expected_size: int | None,
        max_size: int | None,
        expected_digest: Digest | None,
        path: str | Path,
    ) -> None:
        self.dataset = dataset
        self.key = key
        self.expected_size = expected_size
        self.max_size = max_size
        self.expected_digest = expected_digest
        self.path = path
        self._fd: int | None = None
        self._hasher = ContentHasher()
        self.size = 0
        self._digest: Digest | None = None
        self._aborted = False
        self._detached = False
        self._moved = False
        self._sized = False  # written whole in one go (of_bytes): its length is set
        self._lock = threading.Lock()  # abort may come from another thread (cancellation)

    def _open(self, flags: int) -> None:
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            raise StorageError(
                f"could not start writing {self.dataset}/{self.key} in "
                f"{os.path.dirname(self.path)}: "
                f"{err.strerror}"
            ) from err

    @classmethod
    def of_bytes(
        cls,
        root: Path,
        dataset: str,
        key: str,
        data: bytes | bytearray | memoryview,
        *,
        expected_size: int,
        expected_digest: Digest | None,
    ) -> StagedWrite:
        """A small object whose bytes are all at hand (an inline change event's), staged
        as `write(data)` then `finish(sync=False)` would, with the same checks and
        errors, but checked BEFORE any file is made (a bad item of a bundle costs no
        create and unlink) and written in one call. The file is left open: `finish()`
        fsyncs it, `close_unsynced()` closes it for a caller's one `syncfs`. Not for
        data with a run of zeros to leave as a hole (`HOLE_MIN_BYTES`)."""
        staged = cls.__new__(cls)
        # The path as text: pathlib's join and its conversion for open() cost more than
        # the hash of a small object.
        staged._fields(
            dataset,
            key,
            expected_size,
            None,
            expected_digest,
            f"{os.fspath(root)}/{TMP}/{temporary_name()}",
        )
        view = memoryview(data).cast("B")
        size = len(view)
        digest = checked_bytes(
            dataset, key, view, expected_size=expected_size, expected_digest=expected_digest
        )
        staged._open(os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        fd = staged._require_open()
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as err:
            staged._abort_locked()
            raise StorageError(
                f"could not write {dataset}/{key} to {os.path.dirname(staged.path)}: "
                f"{err.strerror}; nothing was stored"
            ) from err
        staged.size = size
        staged._digest = digest
        staged._sized = True
        return staged

    def _continue(self, offset: int) -> None:
        """Take up a file a resumable transfer left: keep its first `offset` bytes (what
        its last checkpoint made durable; anything after it may be torn), hash them
        again (a hasher's state cannot be saved) and continue writing after them."""
        fd = self._require_open()
        try:
            held = os.fstat(fd).st_size
            # A checkpoint that claims more than the file kept: trust the file.
            offset = min(offset, held)
            os.ftruncate(fd, offset)
            done = 0
            while done < offset:
                piece = os.pread(fd, min(1 << 22, offset - done), done)
                if not piece:
                    break
                self._hasher.update(piece)
                done += len(piece)
            os.lseek(fd, done, os.SEEK_SET)
        except OSError as err:
            self._abort_locked()
            raise StorageError(
                f"could not take up the partial {self.dataset}/{self.key} at {self.path}: "
                f"{err.strerror}"
            ) from err
        self.size = done

    def checkpoint(self) -> int:
        """fsync what was written so far and return its length: a resumable transfer
        records that length, and a later attempt continues from it (`_continue`)."""
        with self._lock:
            fd = self._require_open()
            size = self.size
            try:
                # Zero chunks are left as holes (seeked over, not written), so a file
                # cut inside a run of zeros is shorter than `size`: extend it, or a
                # resume would take up fewer bytes than the sender was told to skip.
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                # A duplicate descriptor, so the fsync runs outside the lock: writes go
                # on meanwhile (the fsync covers every byte written before `size` was read).
                fd = os.dup(fd)
            except OSError as err:
                raise StorageError(
                    f"could not checkpoint the partial {self.dataset}/{self.key}: {err.strerror}"
                ) from err
        try:
            files.fsync_file(fd)
        except OSError as err:
            raise StorageError(
                f"could not make the partial {self.dataset}/{self.key} durable: {err.strerror}"
            ) from err
        finally:
            os.close(fd)
        return size

    def detach(self) -> None:
        """Close the file but keep it (a cut resumable transfer continues from it later);
        the write can no longer be committed or aborted through this object."""
        with self._lock:
            self._aborted = True
            self._detached = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append one chunk: hash it and write it; refuse it if it passes a size limit."""
        if self._digest is not None:
            raise InvalidInputError(f"the write of {self.dataset}/{self.key} is already finished")
        try:
            view = memoryview(chunk).cast("B")
        except TypeError:
            raise InvalidInputError(
                f"a chunk of {self.dataset}/{self.key} must be bytes, got {type(chunk).__name__}"
                " (open files in binary mode)"
            ) from None
        with self._lock:
            fd = self._require_open()
            new_size = self.size + len(view)
            for limit, what in (
                (self.expected_size, "its stated size"),
                (self.max_size, "the cap"),
            ):
                if limit is not None and new_size > limit:
                    self._abort_locked()
                    raise TooLargeError(
                        f"object {self.dataset}/{self.key} passed {what} of {limit} bytes; "
                        "nothing was stored"
                    )
            self._hasher.update(view)
            try:
                if _all_zero(view):
                    # A hole instead of zeros (finish() sets the length): a sparse
                    # checkpoint or disk image costs no disk for its empty regions.
                    os.lseek(fd, len(view), os.SEEK_CUR)
                    view = view[len(view) :]
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError as err:
                self._abort_locked()
                raise StorageError(
                    f"could not write {self.dataset}/{self.key} to {os.path.dirname(self.path)}: "
                    f"{err.strerror}; nothing was stored"
                ) from err
            self.size = new_size

    def finish(self, *, sync: bool = True) -> Digest:
        """End the stream: check the size and digest, then (unless `sync=False`, for a
        caller that fsyncs many files at once by calling `finish()` again) fsync and
        close. Returns the digest; idempotent. On a mismatch the temporary file is
        removed and the error raised."""
        with self._lock:
            if self._aborted:
                raise InvalidInputError(f"the write of {self.dataset}/{self.key} was aborted")
            if self._digest is None:
                self._require_open()
                if self.expected_size is not None and self.size != self.expected_size:
                    self._abort_locked()
                    raise ShortStreamError(
                        f"object {self.dataset}/{self.key} ended after {self.size} of its "
                        f"{self.expected_size} bytes; nothing was stored"
                    )
                digest = self._hasher.digest()
                if self.expected_digest is not None and digest != self.expected_digest:
                    self._abort_locked()
                    raise DigestMismatchError(
                        f"object {self.dataset}/{self.key} hashed to {digest}, not the stated "
                        f"{self.expected_digest}; nothing was stored"
                    )
                self._digest = digest
            if sync and self._fd is not None:
                try:
                    os.ftruncate(self._fd, self.size)  # a trailing hole has no length yet
                    files.fsync_file(self._fd)
                except OSError as err:
                    self._abort_locked()
                    raise StorageError(
                        f"could not make {self.dataset}/{self.key} durable: {err.strerror}; "
                        "nothing was stored"
                    ) from err
                os.close(self._fd)
                self._fd = None
            return self._digest

    def close_unsynced(self) -> None:
        """After `finish(sync=False)`: set the length and close without an fsync, for a
        caller that makes many files durable with one `files.syncfs` instead."""
        with self._lock:
            if self._digest is None:
                raise InvalidInputError(f"the write of {self.dataset}/{self.key} is not finished")
            if self._fd is not None:
                try:
                    if not self._sized:  # a trailing hole has no length yet
                        os.ftruncate(self._fd, self.size)
                except OSError as err:
                    self._abort_locked()
                    raise StorageError(
                        f"could not write {self.dataset}/{self.key}: {err.strerror}; "
                        "nothing was stored"
                    ) from err
                os.close(self._fd)
                self._fd = None

    def moved(self) -> None:
        """The store renamed the file to its version path: `abort` (the `with` block's
        end) then has no file to remove and skips the unlink."""
        with self._lock:
            self._moved = True

    @property
    def digest(self) -> Digest:
        if self._digest is None:
            raise InvalidInputError("the staged write was not finished; call finish() first")
        return self._digest

    def abort(self) -> None:
        """Drop the write and its temporary file (idempotent)."""
        with self._lock:
            self._abort_locked()

    def _abort_locked(self) -> None:
        self._aborted = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not (self._detached or self._moved):
            files.remove_file(self.path)

    def _require_open(self) -> int:
        if self._fd is None:
            raise InvalidInputError(
                f"the write of {self.dataset}/{self.key} is already finished or aborted"
            )
        return self._fd

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # After a commit the file was renamed away and this removes nothing.
        self.abort()
