"""Reading one version: an open file and the version it holds, as 1 MiB chunks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Self

from agents.store.model import StoredVersion

CHUNK_BYTES = 1 << 20  # the agent API's message size (spec/dataplane.md)


class ObjectReader:
    """An open version. The file was opened while its metadata row was read, under the
    store's lock, so pruning (row first, then file) cannot take it away: a reader
    always sees the whole version it opened. Iterate for chunks of at most 1 MiB;
    close it (or use `with`)."""

    def __init__(self, stored: StoredVersion, fd: int) -> None:
        self.stored = stored
        self.version = stored.version
        self.size = stored.version.size
        self._fd: int | None = fd

    def read(self, limit: int = CHUNK_BYTES) -> bytes:
        """Up to `limit` bytes; b"" at the end (or once closed)."""
        if self._fd is None:
            return b""
        return os.read(self._fd, limit)

    def fileno(self) -> int:
        """The open file's descriptor (the delta engine reads a version in place); the
        reader keeps owning it: dup it to hold it longer than the reader."""
        if self._fd is None:
            raise ValueError("the reader is closed")
        return self._fd

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        while chunk := self.read(chunk_bytes):
            yield chunk

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks()

    def read_all(self) -> bytes:
        return b"".join(self.chunks())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()


class InlineReader(ObjectReader):
    """An open inline version (its bytes held in the metadata database, read with its
    row under the store's lock, so pruning cannot take them away either). The same
    interface; `fileno` copies the bytes into an anonymous memory file on first use,
    for the delta engine, which reads a version through a descriptor."""

    def __init__(self, stored: StoredVersion, data: bytes) -> None:
        self.stored = stored
        self.version = stored.version
        self.size = stored.version.size
        self._fd = None
        self._data: bytes | None = data
        self._at = 0

    def read(self, limit: int = CHUNK_BYTES) -> bytes:
        if self._data is None:
            return b""
        piece = self._data[self._at : self._at + limit]
        self._at += len(piece)
        return piece

    def fileno(self) -> int:
        if self._data is None:
            raise ValueError("the reader is closed")
        if self._fd is None:
            fd = os.memfd_create("meridian-inline", os.MFD_CLOEXEC)
            try:
                view = memoryview(self._data)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def close(self) -> None:
        self._data = None
        super().close()
