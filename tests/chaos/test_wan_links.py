"""The async Toxiproxy client and the per-region Kafka link, against the private stack."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from chaos.stack import PrivateStack, region_listener_port, region_wan_port
from chaos.toxiproxy import AsyncToxiproxy
from controlplane.errors import NotFoundError, UnavailableError
from controlplane.loopback import free_port
from controlplane.stack.kafka import HEALTH_TOPIC

pytestmark = pytest.mark.integration


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


async def ping(port: int, timeout_s: float = 5.0) -> bytes:  # an answer must come: loose
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"ping\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout_s)
    finally:
        writer.close()


async def test_cut_clear_disable_and_delete(private_stack: PrivateStack, echo_port: int) -> None:
    name = f"chaos-test-{uuid.uuid4().hex[:8]}"
    listen = free_port()
    async with AsyncToxiproxy(private_stack.toxiproxy_url) as toxi:
        await toxi.create_proxy(name, f"127.0.0.1:{listen}", f"127.0.0.1:{echo_port}")
        try:
            assert await ping(listen) == b"ping\n"
            await toxi.cut(name)
            assert sorted(await toxi.toxics(name)) == ["timeout_downstream", "timeout_upstream"]
            with pytest.raises(TimeoutError):
                await ping(listen, timeout_s=0.5)
            await toxi.clear(name)
            assert await toxi.toxics(name) == []
            assert await ping(listen) == b"ping\n"
            await toxi.set_enabled(name, False)
            with pytest.raises(OSError):
                await ping(listen)
            await toxi.clear(name)  # also enables
            assert await ping(listen) == b"ping\n"
        finally:
            await toxi.delete_proxy(name)
        with pytest.raises(NotFoundError):
            await toxi.delete_proxy(name)


async def test_a_silent_server_fails_the_call_within_its_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        async with AsyncToxiproxy(f"127.0.0.1:{port}", timeout_s=0.5) as toxi:
            t0 = time.monotonic()
            with pytest.raises(UnavailableError, match="did not answer"):
                await toxi.version()
            assert time.monotonic() - t0 < 3


async def test_cutting_one_regions_kafka_link_leaves_the_others(
    private_stack: PrivateStack,
) -> None:
    s = private_stack.settings
    async with AsyncToxiproxy(private_stack.toxiproxy_url) as toxi:
        names = []
        for i in (0, 1):
            names.append(f"chaos-test-kafka{i}")
            upstream = f"127.0.0.1:{region_listener_port(s, i)}"
            await toxi.create_proxy(names[i], f"127.0.0.1:{region_wan_port(s, i)}", upstream)
        producers = [
            AIOKafkaProducer(
                bootstrap_servers=f"127.0.0.1:{region_wan_port(s, i)}", request_timeout_ms=3000
            )
            for i in (0, 1)
        ]
        try:
            for p in producers:
                await asyncio.wait_for(p.start(), 10)
                await asyncio.wait_for(p.send_and_wait(HEALTH_TOPIC.name, b"before"), 10)
            # Both bootstrapped. Were region 0 told to reconnect straight to the broker,
            # cutting its proxy now would not stop it: it must fail, region 1 must not.
            await toxi.set_enabled(names[0], False)
            with pytest.raises((KafkaError, TimeoutError)):
                await asyncio.wait_for(producers[0].send_and_wait(HEALTH_TOPIC.name, b"cut"), 8)
            await asyncio.wait_for(producers[1].send_and_wait(HEALTH_TOPIC.name, b"up"), 10)
        finally:
            for p in producers:
                await p.stop()
            for name in names:
                await toxi.delete_proxy(name)
