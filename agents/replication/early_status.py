"""A `Replicate` refused early, when grpc aio hides the replica's status (grpc/grpc#36066).

grpc aio sometimes reports a server's early status on a client stream that is still
sending as INTERNAL "Internal error from Core" instead of the status the server set.
A replica decides its refusals (a stale epoch, a handover, residency) at the header,
before any chunk, so an owner's push of a large version was refused that way while its
chunks still went out: read as INTERNAL (a `StorageError`, not retriable, not fenced),
a deposed owner took its fencing for a transient failure and never rewound its write,
and a handover's retriable refusal failed the write for good.

On that INTERNAL the call is made again with the header alone (`header_alone`): with
nothing left to send after the status, the status arrives intact, nearly always; the
bug can hide it again, so the header is asked a few times (bounded, within the push's
deadline); hidden on every ask, the owner reads the fence from etcd instead (sync.py,
`_hidden_fence`). A header alone
never stores a non-empty version (its bytes are missing: the replica answers "short"
or, for a delta, a failed patch), and a call the replica admits reads every frame, so
it never ends early and never gets here. A tombstone or an empty version is its header
alone: the second ask is that push, whole.

The owner's push (sync.py, `_replicate_call`) and the tests' raw pushes
(tests/harness/raw_replicate.py) both ask again through `header_alone`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc

from agents.client import CORE_INTERNAL
from meridian.v1 import agent_pb2, agent_pb2_grpc


def core_internal(err: grpc.aio.AioRpcError) -> bool:
    """grpc aio's INTERNAL in place of a server's early status. An agent's own INTERNAL
    (a `StorageError`) never says this."""
    return err.code() == grpc.StatusCode.INTERNAL and CORE_INTERNAL in (err.details() or "")


async def header_alone(
    stub: agent_pb2_grpc.AgentAsyncStub,
    header: agent_pb2.ReplicateHeader,
    *,
    timeout_s: float,
    attempts: int = 1,
) -> agent_pb2.ReplicateResponse:
    """`Replicate` with `header` and no other frame, asked at most `attempts` times while
    the same bug hides its status, all within `timeout_s` (a budget for every ask, not
    one each: the caller's deadline holds): the replica's answer, or its status as the
    `grpc.aio.AioRpcError` raised (the last hidden one when every ask was hidden)."""

    async def frames() -> AsyncIterator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)

    until = time.monotonic() + timeout_s
    hidden: grpc.aio.AioRpcError | None = None
    for attempt in range(max(1, attempts)):
        left = until - time.monotonic()
        if attempt > 0 and left <= 0:
            break  # the budget is spent: the last hidden status stands
        try:
            response: agent_pb2.ReplicateResponse = await stub.Replicate(
                frames(), timeout=max(left, 0.0)
            )
            return response
        except grpc.aio.AioRpcError as err:
            if not core_internal(err):
                raise
            hidden = err
    assert hidden is not None  # noqa: S101 - the loop ran at least once
    raise hidden
