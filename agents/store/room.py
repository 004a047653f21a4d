"""Whether the store's disk can take a write of a stated size, before any byte of it.

A Put states its size in its header and a pull knows the version's size before it asks
for a byte: both are refused at once when the disk cannot take it with a reserve left
for the metadata and the writes under way, rather than failing on a full disk after
streaming what fits, which fails every other write of the agent meanwhile.
"""

from __future__ import annotations

from os import statvfs
from pathlib import Path

from agents.store.errors import NoRoomError, TooLargeError

RESERVE_BYTES = 256 << 20


def check_room(
    root: Path, what: str, size: int, error: type[TooLargeError] | type[NoRoomError] = TooLargeError
) -> None:
    """Raise `error` naming `what` when `size` more bytes do not fit under `root` with
    `RESERVE_BYTES` left free: `TooLargeError` for a client's Put (final for that
    request), `NoRoomError` for a copy (retriable: the replicator tries it again)."""
    fs = statvfs(root)
    free = fs.f_bavail * fs.f_frsize
    if size > free - RESERVE_BYTES:
        raise error(
            f"{what} would be {size} bytes, and this agent's disk has {max(0, free)} bytes "
            f"free ({RESERVE_BYTES} kept in reserve); nothing was stored"
        )
