"""The file-system steps of the write protocol, one function each.

Each step is a module-level function so that the crash tests (tests/store/)
can stop a child process between any two of them. All of them block; the daemon
calls the store through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import threading
from collections.abc import Callable
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


# linux/fs.h: the inode flags' ioctls, and the "top of a directory hierarchy" flag.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_TOPDIR_FL = 0x00020000


def mark_top_dir(path: Path) -> bool:
    """Mark a folder as the top of a directory hierarchy (`chattr +T`), so ext4 spreads
    the folders made in it over quiet block groups instead of packing them beside
    their parent. Why a store cares: without a journal (this machine's ext4 and CI's),
    making a file skips, one by one from the start of its block group, every inode of
    the group freed in the last minute (`recently_deleted` in fs/ext4/ialloc.c); a
    store under a busy shared /tmp then spent 0.2-1 ms of CPU per file it created.
    A hint only: False (and nothing changed) where the file system has no such flag."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        got = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("l", 0))
        flags = struct.unpack("l", got)[0]
        if not flags & _FS_TOPDIR_FL:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("l", flags | _FS_TOPDIR_FL))
        return True
    except OSError:  # not ext2/3/4 (ENOTTY, EOPNOTSUPP), or not allowed
        return False
    finally:
        os.close(fd)


def remove_empty_dir(path: Path) -> None:
    """Remove a folder if it is empty; leave it otherwise."""
    with contextlib.suppress(OSError):  # not empty, or already gone
        os.rmdir(path)
