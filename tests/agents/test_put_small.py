"""PutSmall (agents/service/servicer.py): a whole object of at most INLINE_BYTES in one
unary call stores, answers and refuses what the same object sent as a Put stream
would; the client library (agents/client.py) sends small objects this way, and a
Put stream to an agent that serves no PutSmall."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    STANDARD,
    TIMEOUT_S,
    US_ONLY,
    Agent,
    get,
    refusal,
    start_agent,
    stop_agent,
)
from blake3 import blake3

from agents.client import SMALL_BYTES, SMALL_RETRY_S, AgentClient
from agents.errors import ResidencyError
from agents.service.servicer import INLINE_BYTES
from controlplane.coordination.protocols.fencing import StaleEpochError
from meridian.v1 import agent_pb2, agent_pb2_grpc

KiB = 1 << 10


def small(dataset: str, key: str, data: bytes, **fields: object) -> agent_pb2.PutSmallRequest:
    header = agent_pb2.PutHeader(dataset=dataset, key=key, **fields)  # type: ignore[arg-type]
    return agent_pb2.PutSmallRequest(header=header, data=data)


def test_the_client_sends_at_most_what_the_agent_keeps_inline() -> None:
    assert SMALL_BYTES == INLINE_BYTES


async def test_a_put_small_is_stored_inline_and_read_back_bit_exact(agent: Agent) -> None:
    data = os.urandom(KiB)
    digest = "blake3:" + blake3(data).hexdigest()
    resp = await agent.stub.PutSmall(
        small(STANDARD, "k", data, size=len(data), digest=digest), timeout=TIMEOUT_S
    )
    assert resp.version.digest == digest and resp.version.size == len(data)
    assert list(resp.regions) == [agent.service.region]
    assert agent.files() == []  # kept in the store's database
    _, body = await get(agent, STANDARD, "k")
    assert body == data
    assert [e.key for e in agent.store.outbox_pending(limit=10)] == ["k"]
    assert agent.requests("PutSmall", "OK") == 1


async def test_a_critical_put_small_is_handed_on_with_its_bytes(agent: Agent) -> None:
    data = os.urandom(KiB)
    resp = await agent.stub.PutSmall(small(CRITICAL, "c", data, epoch=7), timeout=TIMEOUT_S)
    (write,) = agent.replication.writes
    assert write.key == "c" and write.data == data
    assert write.version is not None and write.version.hlc.text == resp.version.hlc


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"size": KiB - 1}, grpc.StatusCode.RESOURCE_EXHAUSTED),  # longer than stated
        ({"size": KiB + 1}, grpc.StatusCode.INVALID_ARGUMENT),  # shorter than stated
        ({"digest": "blake3:" + blake3(b"other").hexdigest()}, grpc.StatusCode.DATA_LOSS),
        ({"digest": "md5:00"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"epoch": 3}, grpc.StatusCode.FAILED_PRECONDITION),  # critical, stale epoch
    ],
)
async def test_a_bad_put_small_gets_the_code_a_put_stream_gets_and_stores_nothing(
    agent: Agent, fields: dict[str, object], code: grpc.StatusCode
) -> None:
    data = os.urandom(KiB)
    dataset = CRITICAL if "epoch" in fields else STANDARD

    async def stream() -> AsyncIterator[agent_pb2.PutRequest]:
        yield agent_pb2.PutRequest(header=small(dataset, "s", data, **fields).header)
        yield agent_pb2.PutRequest(chunk=data)
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    as_stream, _ = await refusal(lambda: agent.stub.Put(stream(), timeout=TIMEOUT_S))
    with pytest.raises(grpc.aio.AioRpcError) as as_small:
        await agent.stub.PutSmall(small(dataset, "u", data, **fields), timeout=TIMEOUT_S)
    assert as_small.value.code() == as_stream.code() == code, as_small.value.details()
    assert agent.files() == []
    assert agent.store.list_objects(dataset, include_deleted=True).items == []


@pytest.mark.parametrize(
    ("request_", "where"),
    [
        (small(STANDARD, "big", bytes(INLINE_BYTES + 1)), "PutSmallRequest.data"),
        (small(STANDARD, "../up", b"x"), "PutHeader.key"),
        (small("", "k", b"x"), "PutHeader.dataset"),
    ],
)
async def test_a_put_small_that_is_too_large_or_misnamed_is_refused_naming_the_field(
    agent: Agent, request_: agent_pb2.PutSmallRequest, where: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.PutSmall(request_, timeout=TIMEOUT_S)
    assert caught.value.code() in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert where in (caught.value.details() or "")
    assert agent.files() == []


async def test_the_client_puts_small_objects_in_one_call_and_large_ones_as_a_stream(
    agent: Agent, tmp_path: Path
) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(os.urandom(SMALL_BYTES))
    large = os.urandom(SMALL_BYTES + 1)
    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        from_file = await client.put(STANDARD, "f", path)
        from_bytes = await client.put(STANDARD, "b", b"tiny")
        await client.put(STANDARD, "l", large)
        with pytest.raises(ResidencyError):
            await client.put(US_ONLY, "x", b"tiny")
        with pytest.raises(StaleEpochError):
            await client.put(CRITICAL, "x", b"tiny", epoch=1)
    assert agent.requests("PutSmall", "OK") == 2
    assert agent.requests("Put", "OK") == 1
    assert from_file.size == SMALL_BYTES and from_bytes.size == 4
    assert (await get(agent, STANDARD, "l"))[1] == large
    assert (await get(agent, STANDARD, "f"))[1] == path.read_bytes()


class _StreamOnly(agent_pb2_grpc.AgentServicer):
    """An agent from before PutSmall: the real servicer's Put, no PutSmall (UNIMPLEMENTED,
    as the generated base answers) until `upgraded`."""

    def __init__(self, real: agent_pb2_grpc.AgentServicer) -> None:
        self.real = real
        self.upgraded = False

    async def PutSmall(  # noqa: N802 - the generated name
        self, request: agent_pb2.PutSmallRequest, context: Any
    ) -> agent_pb2.PutResponse:
        if not self.upgraded:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        response: agent_pb2.PutResponse = await self.real.PutSmall(request, context)
        return response

    async def Put(  # noqa: N802 - the generated name
        self, request_iterator: AsyncIterator[agent_pb2.PutRequest], context: Any
    ) -> agent_pb2.PutResponse:
        response: agent_pb2.PutResponse = await self.real.Put(request_iterator, context)
        return response


async def test_the_client_sends_a_put_stream_to_an_agent_without_put_small(
    agent: Agent,
) -> None:
    server = grpc.aio.server()
    old = _StreamOnly(agent.service)
    agent_pb2_grpc.add_AgentServicer_to_server(old, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    now = [1000.0]
    try:
        async with AgentClient(f"127.0.0.1:{port}", clock=lambda: now[0]) as client:
            first = await client.put(STANDARD, "a", b"first")
            second = await client.put(STANDARD, "b", b"second")
            assert agent.requests("Put", "OK") == 2
            # The agent behind the address may be upgraded: PutSmall is asked again
            # once SMALL_RETRY_S has passed.
            old.upgraded = True
            now[0] += SMALL_RETRY_S - 1
            await client.put(STANDARD, "c", b"third")
            assert agent.requests("PutSmall", "OK") == 0
            now[0] += 1
            await client.put(STANDARD, "d", b"fourth")
            assert agent.requests("PutSmall", "OK") == 1
    finally:
        await server.stop(None)
    assert (first.size, second.size) == (5, 6)
    assert (await get(agent, STANDARD, "b"))[1] == b"second"


async def test_the_client_streams_a_pipe_whatever_size_it_states(
    agent: Agent, tmp_path: Path
) -> None:
    """A FIFO says 0 bytes, whatever comes through it: it is streamed, never read whole
    first (an endless one would fill the memory), small or not."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = os.urandom(KiB)

    def feed() -> None:
        with open(fifo, "wb") as out:
            out.write(data)

    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        version, _ = await asyncio.gather(
            client.put(STANDARD, "piped", fifo), asyncio.to_thread(feed)
        )
    assert version.size == len(data)
    assert (await get(agent, STANDARD, "piped"))[1] == data
    assert agent.requests("PutSmall", "OK") == 0


async def test_a_put_small_over_the_agent_s_cap_is_refused_as_a_put_is(tmp_path: Path) -> None:
    capped = await start_agent(tmp_path / "capped", max_object_bytes=100)
    try:
        for fields in ({"size": 101}, {}):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await capped.stub.PutSmall(
                    small(STANDARD, "k", bytes(101), **fields), timeout=TIMEOUT_S
                )
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, fields
        assert capped.files() == []
        assert capped.store.list_objects(STANDARD, include_deleted=True).items == []
    finally:
        await stop_agent(capped)
