"""The file-system steps of the write protocol, one function each.

Each step is a module-level function so that the crash tests (tests/store/)
can stop a child process between any two of them. All of them block; the daemon
calls the store through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

# Held while folders are created, so no thread renames into a folder another thread
# made but has not yet made durable in its parent.
_mkdir_lock = threading.Lock()


def fsync_file(fd: int) -> None:
    """Make a file's bytes durable."""
    os.fsync(fd)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it, a new child) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):
        return None
    return fn


_SYNCFS = _libc_syncfs()


def can_syncfs() -> bool:
    return _SYNCFS is not None


def syncfs(path: Path) -> None:
    """Make every file and folder of the file system holding `path` durable at once
    (Linux syncfs(2): it waits for the writes and, since 5.8, reports their errors).
    One call instead of thousands of fsyncs for a bundle of small objects."""
    if _SYNCFS is None:
        raise OSError(errno.ENOSYS, "syncfs is not available")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def replace(src: str | Path, dst: str | Path) -> None:
    """Atomically put `src` at `dst` (same file system)."""
    os.replace(src, dst)


def remove_file(path: str | Path) -> None:
    """Remove a file if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def make_dirs(root: Path, relative: Path) -> Path:
    """Create `root/relative` and any missing parents, each made durable in its parent
    (a rename into a folder whose own entry was lost in a crash would be lost too)."""
    path = root
    with _mkdir_lock:
        for part in relative.parts:
            parent, path = path, path / part
            if not path.is_dir():
                os.mkdir(path)
                fsync_dir(parent)
    return path


def make_children(parent: Path, names: Iterable[str]) -> None:
    """Create folders `names` in `parent` (an existing folder), with one fsync of it for
    all, under the lock `make_dirs` takes: no other thread sees one as made (and renames
    into it) before its entry is durable."""
    with _mkdir_lock:
        for name in sorted(names):
            (parent / name).mkdir(exist_ok=True)
        fsync_dir(parent)


def remove_empty_dir(path: Path) -> None:
    """Remove a folder if it is empty; leave it otherwise."""
    with contextlib.suppress(OSError):  # not empty, or already gone
        os.rmdir(path)
