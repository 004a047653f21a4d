"""`AgentClient.get` against an agent that lies (a fake servicer in this process: a real
agent cannot be made to send bytes that do not match their version): the output file
is written only when size and digest hold, and nothing is left behind otherwise."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agents.client import CHUNK_BYTES, AgentClient
from agents.store.errors import DigestMismatchError, ShortStreamError
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from meridian import convert
from meridian.v1 import agent_pb2, agent_pb2_grpc

HLC_TEXT = "1764579123456.00000@eu-west"


class LyingAgent(agent_pb2_grpc.AgentServicer):
    """Serves `content` under a version that claims `claimed` (size and digest)."""

    def __init__(self, content: bytes, claimed: bytes) -> None:
        self.content = content
        self.version = Version.put(HLC.parse(HLC_TEXT), len(claimed), Digest.of(claimed))

    async def Stat(  # noqa: N802
        self, request: agent_pb2.StatRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> agent_pb2.StatResponse:
        return agent_pb2.StatResponse(
            object=agent_pb2.ObjectInfo(
                dataset=request.dataset,
                key=request.key,
                version=convert.version_to_wire(self.version),
            )
        )

    async def Get(  # noqa: N802
        self, request: agent_pb2.GetRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[agent_pb2.GetResponse]:
        yield agent_pb2.GetResponse(header=convert.version_to_wire(self.version))
        for at in range(0, len(self.content), CHUNK_BYTES):
            yield agent_pb2.GetResponse(chunk=self.content[at : at + CHUNK_BYTES])


async def serve(servicer: LyingAgent) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("content", "claimed", "error"),
    [
        (b"a" * 3_000_000, b"b" * 3_000_000, DigestMismatchError),  # same size, other bytes
        (b"a" * 1_000, b"a" * 2_000, ShortStreamError),  # cut short
        (b"a" * 2_000, b"a" * 1_000, ShortStreamError),  # too long
    ],
)
async def test_a_get_that_does_not_match_its_version_writes_nothing(
    tmp_path: Path, content: bytes, claimed: bytes, error: type[Exception]
) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(b"the previous content")
    server, address = await serve(LyingAgent(content, claimed))
    try:
        async with AgentClient(address) as client:
            with pytest.raises(error):
                await client.get("corpus/x", "k", out)
    finally:
        await server.stop(None)
    assert out.read_bytes() == b"the previous content"
    assert os.listdir(tmp_path) == ["out.bin"]


async def test_a_true_get_replaces_the_output_and_keeps_zeros_as_holes(tmp_path: Path) -> None:
    content = os.urandom(1000) + bytes(8 * CHUNK_BYTES) + b"tail"
    server, address = await serve(LyingAgent(content, content))
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    seen: list[int] = []
    try:
        async with AgentClient(address) as client:
            got = await client.get(
                "corpus/x", "k", out, progress=lambda done, total: seen.append(done)
            )
    finally:
        await server.stop(None)
    assert got.size == len(content)
    assert out.read_bytes() == content
    assert out.stat().st_blocks * 512 < 4 * CHUNK_BYTES  # the zero chunks cost no disk
    assert seen[-1] == len(content)
    assert os.listdir(tmp_path) == ["out.bin"]
