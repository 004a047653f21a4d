"""Meridian errors ↔ gRPC status codes (spec/dataplane.md, *The agent API*).

A server aborts a call with `abort(context, exc)`: the code of the error's class and
its one-sentence message, plus the class name in the trailing metadata
(`meridian-error`) so that a client re-raises the same class with `from_rpc_error`,
not only one of its code (FAILED_PRECONDITION is a stale epoch, but UNAVAILABLE may be
a handover, an unreachable etcd or a lost file; each says whether to retry).
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from agents.errors import NotGovernedError, NotOwnerError, ResidencyError
from agents.store.errors import (
    DeletedError,
    DigestMismatchError,
    MissingContentError,
    NoRoomError,
    ShortStreamError,
    StorageError,
    StoreLockedError,
    TooLargeError,
)
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, StaleEpochError
from controlplane.domain.errors import ClockSkewError
from controlplane.errors import (
    ConfigError,
    ConflictError,
    FencedError,
    HandingOverError,
    InvalidInputError,
    MeridianError,
    NotFoundError,
    OperationTimeoutError,
    RefusedError,
    UnavailableError,
)

ERROR_KEY = "meridian-error"

# Most specific first: the first class an error is an instance of decides its code.
_CODES: tuple[tuple[type[MeridianError], grpc.StatusCode], ...] = (
    (ResidencyError, grpc.StatusCode.PERMISSION_DENIED),
    (DigestMismatchError, grpc.StatusCode.DATA_LOSS),
    (TooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (FencedError, grpc.StatusCode.FAILED_PRECONDITION),
    (HandingOverError, grpc.StatusCode.UNAVAILABLE),
    (OperationTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ConflictError, grpc.StatusCode.ABORTED),
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (RefusedError, grpc.StatusCode.FAILED_PRECONDITION),
    (StorageError, grpc.StatusCode.INTERNAL),
)

# The classes a client can re-raise by name; anything else falls back to its code.
_BY_NAME: dict[str, type[MeridianError]] = {
    cls.__name__: cls
    for cls in (
        ResidencyError,
        ClockSkewError,
        NotGovernedError,
        NotOwnerError,
        DigestMismatchError,
        TooLargeError,
        ShortStreamError,
        MissingContentError,
        NoRoomError,
        StoreLockedError,
        StorageError,
        StaleEpochError,
        FencedError,
        DatasetHandingOverError,
        HandingOverError,
        OperationTimeoutError,
        UnavailableError,
        DeletedError,
        NotFoundError,
        ConflictError,
        InvalidInputError,
        ConfigError,
        RefusedError,
    )
}

_BY_CODE: dict[grpc.StatusCode, type[MeridianError]] = {
    grpc.StatusCode.PERMISSION_DENIED: ResidencyError,
    grpc.StatusCode.DATA_LOSS: DigestMismatchError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: TooLargeError,
    grpc.StatusCode.FAILED_PRECONDITION: FencedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: OperationTimeoutError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}


def code_of(exc: MeridianError) -> grpc.StatusCode:
    """The status code a server answers `exc` with."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


async def abort(context: grpc.aio.ServicerContext[object, object], exc: MeridianError) -> NoReturn:
    """End the call with `exc`'s code and message (raises, as grpc's abort does)."""
    await context.abort(
        code_of(exc), str(exc), trailing_metadata=((ERROR_KEY, type(exc).__name__),)
    )
    raise AssertionError("grpc's abort returned")  # pragma: no cover - abort always raises


def from_rpc_error(err: grpc.aio.AioRpcError | grpc.RpcError, peer: str = "") -> MeridianError:
    """The Meridian error a failed call stands for, to raise on the client side.

    A status the server set on purpose keeps its class and message; anything else
    (the peer unreachable, a deadline, a crash) becomes a retriable `UnavailableError`
    naming the peer."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else ""
    name = ""
    trailing = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else ()
    for item in trailing or ():
        key, value = getattr(item, "key", None), getattr(item, "value", None)
        if key is None:  # grpc.aio gives plain (key, value) tuples
            key, value = tuple(item)  # type: ignore[arg-type]
        if key == ERROR_KEY:
            name = value if isinstance(value, str) else bytes(value or b"").decode()
    cls = _BY_NAME.get(name)
    if cls is not None:
        return rebuilt(cls, details or f"the agent at {peer or 'the peer'} refused the call")
    where = f"the agent at {peer}" if peer else "the agent"
    fallback = _BY_CODE.get(code)
    if fallback is None or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return UnavailableError(f"{where} failed the call ({code.name}): {details or 'no detail'}")
    return fallback(details or f"{where} answered {code.name}")


def rebuilt(cls: type[MeridianError], message: str) -> MeridianError:
    """An instance of `cls` with `message`, also for a class whose constructor wants more
    than the message (its extra fields are the server's business: a client acts on the
    class, `retriable` and the sentence)."""
    try:
        return cls(message)
    except TypeError:
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        return exc


def error_from_parts(class_name: str, code_name: str, message: str) -> MeridianError:
    """The Meridian error of one refused item of a batch call (its class name, else its
    gRPC code name, as `from_rpc_error` reads them from a failed call)."""
    cls = _BY_NAME.get(class_name)
    if cls is not None:
        return rebuilt(cls, message)
    code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.UNKNOWN)
    fallback = _BY_CODE.get(code)
    if fallback is None or code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return UnavailableError(f"the agent refused the item ({code_name}): {message}")
    return fallback(message)
