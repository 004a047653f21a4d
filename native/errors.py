"""The exceptions of the delta engine, one per failure a caller must tell apart.

Each subclasses Meridian's tree (`controlplane.errors`), so the CLI edge prints its
one-sentence message and exits 1. None is retriable as it is: a corrupt or truncated
delta must be fetched again, a wrong basis needs another delta.
"""

from __future__ import annotations

from controlplane.errors import InvalidInputError, MeridianError


class DeltaError(MeridianError):
    """Base of every error of the delta engine."""


class CorruptSignatureError(DeltaError, InvalidInputError):
    """The signature is malformed, truncated or fails a checksum."""


class CorruptDeltaError(DeltaError, InvalidInputError):
    """The delta is malformed, fails a checksum, or does not reproduce its recorded digest."""


class TruncatedDeltaError(DeltaError, InvalidInputError):
    """The delta ends before its end marker (an interrupted transfer)."""


class WrongBasisError(DeltaError, InvalidInputError):
    """OLD is not the file the delta was made against (length or digest differ)."""


class DeltaIOError(DeltaError):
    """Reading an input or writing an output failed at the operating-system level."""

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno


class OutputTooLargeError(DeltaError, InvalidInputError):
    """The delta would write more than the output may have (the caller's cap)."""


class DeltaCancelledError(DeltaError):
    """The operation was cancelled (its progress callback raised, or Ctrl-C)."""
