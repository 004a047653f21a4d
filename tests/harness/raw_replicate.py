"""A raw `Replicate` call, for tests that push a copy by hand and may expect a refusal.

grpc aio (grpc/grpc#36066) sometimes reports a server's early status on a client stream
that is still sending as INTERNAL "Internal error from Core" instead of the status the
server set: on that INTERNAL the call is made again with the header alone, as the
owner's own push does (agents/replication/early_status.py says why that is safe), here
while the same bug hides the status, up to `ATTEMPTS` times.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from agents.replication.early_status import core_internal, header_alone
from meridian.v1 import agent_pb2, agent_pb2_grpc

ATTEMPTS = 3  # the header alone, asked again while the same bug hides its status


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

    async def frames() -> AsyncIterator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)
        for chunk in chunks:
            yield agent_pb2.ReplicateRequest(chunk=chunk)

    async with grpc.aio.insecure_channel(address, options=list(options)) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        try:
            response: agent_pb2.ReplicateResponse = await stub.Replicate(
                frames(),  # type: ignore[arg-type]
                timeout=timeout_s,
            )
            return response
        except grpc.aio.AioRpcError as err:
            if not core_internal(err):
                raise
        return await header_alone(stub, header, timeout_s=timeout_s, attempts=ATTEMPTS)
