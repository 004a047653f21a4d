"""WAN faults through a real Toxiproxy: latency in both directions, and a refused link."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError
from controlplane.loopback import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    yield port
    server.close()
    await server.wait_closed()


async def _round_trip_s(port: int, samples: int = 3) -> float:
    """The fastest of a few ping-pongs over one connection, in seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        best = float("inf")
        for i in range(samples):
            t0 = time.perf_counter()
            writer.write(b"ping%d\n" % i)
            await writer.drain()
            await asyncio.wait_for(reader.readline(), timeout=5)
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        writer.close()
        await writer.wait_closed()


async def test_latency_both_ways_adds_a_full_round_trip(toxiproxy_url: str, echo_port: int) -> None:
    client = ToxiproxyClient(toxiproxy_url)
    name = f"test-latency-{uuid.uuid4().hex[:6]}"
    listen = free_port()
    client.create_proxy(name, listen=f"127.0.0.1:{listen}", upstream=f"127.0.0.1:{echo_port}")
    try:
        baseline = await _round_trip_s(listen)
        client.add_latency(name, latency_ms=100)
        degraded = await _round_trip_s(listen)
        client.remove_toxics(name)
        recovered = await _round_trip_s(listen)
    finally:
        client.delete_proxy(name)
    # Each direction waits >= 100 ms, so a round trip takes >= 200 ms. The baseline
    # overlaps that wait (the proxy's delay runs from when it reads a chunk), so the
    # difference may fall short of 200 ms by the baseline's own few milliseconds.
    assert degraded >= 0.200
    assert degraded - baseline >= 0.190
    # With the toxic still there no round trip could take less than 200 ms; below that
    # is a loaded machine's room (the fastest of three, through the proxy and this loop).
    assert recovered < 0.200


async def test_disabled_proxy_refuses_connections(toxiproxy_url: str, echo_port: int) -> None:
    client = ToxiproxyClient(toxiproxy_url)
    name = f"test-partition-{uuid.uuid4().hex[:6]}"
    listen = free_port()
    client.create_proxy(name, listen=f"127.0.0.1:{listen}", upstream=f"127.0.0.1:{echo_port}")
    try:
        assert await _round_trip_s(listen, samples=1) < 1
        client.disable(name)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", listen)
        client.enable(name)
        assert await _round_trip_s(listen, samples=1) < 1
    finally:
        client.delete_proxy(name)


def test_two_clients_do_not_share_the_library_globals(toxiproxy_url: str) -> None:
    dead = ToxiproxyClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    live = ToxiproxyClient(toxiproxy_url)
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="did not answer"):
        dead.version()
    assert time.monotonic() - t0 < 5
    assert live.version()  # the dead client's address did not stick in the globals


def test_unknown_proxy_is_a_clear_error(toxiproxy_url: str) -> None:
    with pytest.raises(NotFoundError, match="no proxy named 'nope'"):
        ToxiproxyClient(toxiproxy_url).disable("nope")


def test_taken_listen_port_is_a_clear_error(toxiproxy_url: str, echo_port: int) -> None:
    client = ToxiproxyClient(toxiproxy_url)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(InvalidInputError, match=f"127.0.0.1:{port}; is that port already"):
            client.create_proxy(
                "test-taken", listen=f"127.0.0.1:{port}", upstream=f"127.0.0.1:{echo_port}"
            )
