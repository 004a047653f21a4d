"""The native rolling-hash delta engine (C, in native/src) and its Python front.

    from native import signature, delta, patch
    signature("old.bin", "old.sig")
    delta("old.sig", "new.bin", "new.delta", threads=4)
    patch("old.bin", "new.delta", "new.copy")
    delta_basis("old.safetensors", "new.safetensors", "new.delta")  # numeric deltas

See native/FORMAT.md for the file formats and native/delta.py for the guarantees.
"""

from native.delta import (
    DTYPE_WIDTHS,
    MAX_BLOCK_SIZE,
    MAX_THREADS,
    MIN_BLOCK_SIZE,
    DeltaSource,
    DeltaStats,
    default_block_size,
    delta,
    delta_basis,
    delta_chunks,
    element_width,
    patch,
    signature,
)
from native.errors import (
    CorruptDeltaError,
    CorruptSignatureError,
    DeltaCancelledError,
    DeltaError,
    DeltaIOError,
    OutputTooLargeError,
    TruncatedDeltaError,
    WrongBasisError,
)

__all__ = [
    "DTYPE_WIDTHS",
    "MAX_BLOCK_SIZE",
    "MAX_THREADS",
    "MIN_BLOCK_SIZE",
    "CorruptDeltaError",
    "CorruptSignatureError",
    "DeltaCancelledError",
    "DeltaError",
    "DeltaIOError",
    "DeltaSource",
    "DeltaStats",
    "OutputTooLargeError",
    "TruncatedDeltaError",
    "WrongBasisError",
    "default_block_size",
    "delta",
    "delta_basis",
    "delta_chunks",
    "element_width",
    "patch",
    "signature",
]
