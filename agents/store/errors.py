"""Errors of the agent's store, beyond the project's tree (`controlplane.errors`).

The gRPC layer maps each to its code (spec/dataplane.md, *The agent API*):
`DigestMismatchError` → DATA_LOSS, `TooLargeError` → RESOURCE_EXHAUSTED,
`ShortStreamError` and bad names (`InvalidInputError`) → INVALID_ARGUMENT,
`MissingContentError` and `StoreLockedError` → UNAVAILABLE, `StorageError` →
INTERNAL. They live here, not in
controlplane/errors.py, because only the data plane raises them.
"""

from __future__ import annotations

from controlplane.errors import InvalidInputError, MeridianError, NotFoundError, UnavailableError


class DigestMismatchError(MeridianError):
    """Bytes did not hash to the digest the caller stated (DATA_LOSS); nothing was stored."""

    grpc_code = "DATA_LOSS"


class DeletedError(NotFoundError):
    """The object's newest version here is a delete (a tombstone): NOT_FOUND, yet an
    answer, where "not stored here" may only mean another agent holds it."""


class TooLargeError(MeridianError):
    """A stream passed its stated size or the size cap (RESOURCE_EXHAUSTED); nothing was stored."""

    grpc_code = "RESOURCE_EXHAUSTED"


class ShortStreamError(InvalidInputError):
    """A stream ended before its stated size (a cut transfer); nothing was stored."""

    retriable = True
    grpc_code = "INVALID_ARGUMENT"


class MissingContentError(UnavailableError):
    """The metadata names a version whose bytes this store lost (found missing or damaged at
    startup); another region holds them, so a re-sync can bring them back."""

    grpc_code = "UNAVAILABLE"


class StorageError(MeridianError):
    """The store's disk or metadata database failed (full, read-only, I/O error); the
    operation left nothing half-written."""

    grpc_code = "INTERNAL"


class NoRoomError(UnavailableError):
    """This agent's disk cannot take a copy now (with its reserve): retriable, as space
    may be freed; nothing was stored."""

    grpc_code = "UNAVAILABLE"


class StoreLockedError(UnavailableError):
    """Another process has the store's root open."""

    grpc_code = "UNAVAILABLE"
