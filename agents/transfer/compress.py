"""Compression of raw content chunks (a transfer without a basis) as the dataset's
`transfer_compression` says. Each chunk is compressed on its own (so a resumed
transfer can start at any chunk) and sent compressed only when that is smaller.
Adaptive: after `PROBE_CHUNKS` chunks that did not shrink by `MIN_SAVING`, it stops
trying (random or already-compressed content would only cost CPU)."""

from __future__ import annotations

import zstandard

LEVEL = 1
MIN_SAVING = 0.05
PROBE_CHUNKS = 4


class ChunkCompressor:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._compressor = zstandard.ZstdCompressor(level=LEVEL) if enabled else None
        self._misses = 0

    def pack(self, chunk: bytes) -> tuple[bytes, bool]:
        """(bytes to send, whether they are zstd-compressed)."""
        if self._compressor is None or self._misses >= PROBE_CHUNKS:
            return chunk, False
        packed = self._compressor.compress(chunk)
        if len(packed) <= len(chunk) * (1 - MIN_SAVING):
            self._misses = 0
            return packed, True
        self._misses += 1
        return chunk, False


class ChunkDecompressor:
    def __init__(self) -> None:
        self._decompressor = zstandard.ZstdDecompressor()

    def unpack(self, data: bytes, max_bytes: int) -> bytes:
        """A compressed chunk's content; refuses one that would exceed `max_bytes`."""
        return self._decompressor.decompress(data, max_output_size=max_bytes)
