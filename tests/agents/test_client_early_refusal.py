"""AgentClient.put always raises the agent's typed error, also when grpc aio reports an
early refusal of a client stream still sending as INTERNAL "Internal error from Core"
(grpc/grpc#36066): it then asks again with the header alone."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from agent_api_helpers import CRITICAL, STANDARD, Agent

from agents.client import CORE_INTERNAL, VERDICT_ATTEMPTS, AgentClient
from agents.rpc.status import abort
from agents.store.errors import ShortStreamError
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.errors import InvalidInputError, UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

ROUNDS = 25  # bounded: each round is one refused put of a few MiB


async def test_an_early_refusal_reaches_the_writer_typed_every_time(
    agent: Agent, tmp_path: Path
) -> None:
    # The owner's epoch is 7: a put at epoch 3 is refused at its header, while the
    # client still has megabytes to send (the case that raced in grpc aio).
    shard = tmp_path / "shard.bin"
    shard.write_bytes(os.urandom(4 << 20))
    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        for _ in range(ROUNDS):
            with pytest.raises(StaleEpochError, match="epoch 3"):
                await client.put(CRITICAL, "k", shard, epoch=3)
    assert agent.store.list_objects(CRITICAL).items == []


class GlitchingAgent(agent_pb2_grpc.AgentServicer):
    """Test scaffolding (a fake port): a Put ends with the bug's INTERNAL the first
    `glitches` times; after that, a header alone gets `verdict`."""

    def __init__(self, glitches: int, verdict: Exception) -> None:
        self.glitches, self.verdict = glitches, verdict
        self.calls: list[list[str]] = []

    async def Put(  # noqa: N802 - the generated servicer's name
        self,
        request_iterator: AsyncIterator[agent_pb2.PutRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.PutResponse:
        first = await anext(request_iterator)
        self.calls.append([f"size={first.header.size if first.header.HasField('size') else '-'}"])
        if len(self.calls) <= self.glitches:
            await context.abort(grpc.StatusCode.INTERNAL, CORE_INTERNAL)
        rest = [f.WhichOneof("frame") async for f in request_iterator]
        self.calls[-1] += [str(x) for x in rest]
        await abort(context, self.verdict)  # type: ignore[arg-type]
        raise AssertionError("abort returns only by raising")


async def glitching(servicer: GlitchingAgent) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("glitches", [1, VERDICT_ATTEMPTS])
async def test_the_lost_refusal_is_asked_again_with_the_header_alone(glitches: int) -> None:
    servicer = GlitchingAgent(glitches, StaleEpochError("epoch 3 is older than the fence's 7"))
    server, address = await glitching(servicer)
    try:
        async with AgentClient(address) as client:
            with pytest.raises(StaleEpochError, match="epoch 3"):
                await client.put(CRITICAL, "k", _chunks(3), size=3 << 20)
    finally:
        await server.stop(None)
    # the first put, then the header alone (its size stated, no chunk, no end) until
    # the bug lets the refusal through
    assert servicer.calls[0][0] == "size=-"
    assert servicer.calls[glitches:] == [[f"size={3 << 20}"]]


async def test_a_put_admitted_when_asked_again_is_retriable() -> None:
    servicer = GlitchingAgent(1, ShortStreamError("ended after 0 bytes without its end"))
    server, address = await glitching(servicer)
    try:
        async with AgentClient(address) as client:
            with pytest.raises(UnavailableError, match="36066") as caught:
                await client.put(CRITICAL, "k", _chunks(1))
    finally:
        await server.stop(None)
    assert caught.value.retriable
    assert servicer.calls[1] == ["size=-"]  # no size known: none stated (never 0)


async def _chunks(mib: int) -> AsyncIterator[bytes]:
    for _ in range(mib):
        yield os.urandom(1 << 20)


async def test_an_error_of_the_writers_own_source_is_raised_not_a_cancellation(
    agent: Agent,
) -> None:
    # grpc aio cancels a call whose request iterator raises: the writer must get the
    # iterator's error (typed, saying what was wrong), not a bare CancelledError. A
    # dataset the agent admits: a refused header would race the iterator's error.
    async def oversize() -> AsyncIterator[bytes]:
        yield b"x" * (2 << 20)

    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        with pytest.raises(InvalidInputError, match="at most 1048576 bytes, got 2097152"):
            await client.put(STANDARD, "k", oversize())
    assert agent.store.list_objects(STANDARD).items == []


async def test_a_file_that_cannot_be_read_is_named_in_the_error(
    agent: Agent, tmp_path: Path
) -> None:
    folder = tmp_path / "a-folder"  # stat() says 4096 bytes; open() refuses it
    folder.mkdir()
    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        with pytest.raises(InvalidInputError, match=f"cannot read {folder}"):
            await client.put(STANDARD, "k", folder)
