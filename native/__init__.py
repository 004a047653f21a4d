"""The native rolling-hash delta engine (C, in native/src) and its Python front.

    from native import signature, delta, patch
    signature("old.bin", "old.sig")
    delta("old.sig", "new.bin", "new.delta", threads=4)
    patch("old.bin", "new.delta", "new.copy")

See native/FORMAT.md for the file formats and native/delta.py for the guarantees.
"""

from native.delta import (
    MAX_BLOCK_SIZE,
    MAX_THREADS,
    MIN_BLOCK_SIZE,
    DeltaStats,
    default_block_size,
    delta,
    patch,
    signature,
)
from native.errors import (
    CorruptDeltaError,
    CorruptSignatureError,
    DeltaError,
    DeltaIOError,
    TruncatedDeltaError,
    WrongBasisError,
)

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_THREADS",
    "MIN_BLOCK_SIZE",
    "CorruptDeltaError",
    "CorruptSignatureError",
    "DeltaError",
    "DeltaIOError",
    "DeltaStats",
    "TruncatedDeltaError",
    "WrongBasisError",
    "default_block_size",
    "delta",
    "patch",
    "signature",
]
