"""A raw `Replicate` call, for tests that push a copy by hand and may expect a refusal.

grpc aio (grpc/grpc#36066) sometimes reports a server's early status on a client stream
that is still sending as INTERNAL "Internal error from Core" instead of the status the
server set. A replica decides its refusals (a stale epoch, a handover, residency) at
the header, before any chunk: on that INTERNAL the call is made again with the header
alone, which leaves nothing to send after the status, so the status arrives intact. A
header alone never stores a non-empty version (its bytes are missing), and a call the
replica admits reads every frame, so it never ends early and never gets here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from agents.client import CORE_INTERNAL
from meridian.v1 import agent_pb2, agent_pb2_grpc

ATTEMPTS = 3  # the header alone, asked again while the same bug hides its status


def core_internal(err: grpc.aio.AioRpcError) -> bool:
    return err.code() == grpc.StatusCode.INTERNAL and CORE_INTERNAL in (err.details() or "")


async def replicate_raw(
    address: str,
    header: agent_pb2.ReplicateHeader,
    chunks: Sequence[bytes] = (),
    *,
    timeout_s: float = 10,
    options: Sequence[tuple[str, int]] = (),
) -> agent_pb2.ReplicateResponse:
    """Push `header` and `chunks` to the agent at `address`; its refusal raises
    `grpc.aio.AioRpcError` with the agent's own status code."""

    async def frames(with_chunks: bool) -> AsyncIterator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)
        for chunk in chunks if with_chunks else ():
            yield agent_pb2.ReplicateRequest(chunk=chunk)

    async with grpc.aio.insecure_channel(address, options=list(options)) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        lost: grpc.aio.AioRpcError | None = None
        for attempt in range(1 + ATTEMPTS):
            try:
                response: agent_pb2.ReplicateResponse = await stub.Replicate(
                    frames(attempt == 0),  # type: ignore[arg-type]
                    timeout=timeout_s,
                )
                return response
            except grpc.aio.AioRpcError as err:
                if not core_internal(err):
                    raise
                lost = err
        assert lost is not None
        raise lost
