"""A Sync relay for tests: the receiver pulls through it from the real sender, and it
can cut the stream after some bytes or damage a byte in transit. (The Toxiproxy
tests cut real TCP; this one cuts at a known message, in this process.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from agents.transfer.pull import CHANNEL_OPTIONS
from meridian.v1 import agent_pb2, agent_pb2_grpc


@dataclass
class Relay:
    target: str
    cut_after_bytes: int | None = None  # abort once this many payload bytes passed
    damage_at_byte: int | None = None  # flip one payload byte at this offset
    passed: list[int] = field(default_factory=list)  # payload bytes per call
    server: grpc.aio.Server | None = None
    address: str = ""

    async def start(self) -> Relay:
        servicer = agent_pb2_grpc.AgentServicer()
        servicer.Sync = self.Sync  # type: ignore[method-assign]
        self.server = grpc.aio.server(options=CHANNEL_OPTIONS)
        agent_pb2_grpc.add_AgentServicer_to_server(servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=None)

    async def Sync(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.SyncRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> AsyncIterator[agent_pb2.SyncResponse]:
        self.passed.append(0)
        async with grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS) as channel:
            call = agent_pb2_grpc.AgentStub(channel).Sync()

            async def forward() -> None:
                async for request in request_iterator:
                    await call.write(request)
                await call.done_writing()

            pump = asyncio.ensure_future(forward())
            try:
                async for response in call:
                    yield await self._pass(response, context)
            finally:
                pump.cancel()
                call.cancel()

    async def _pass(
        self,
        response: agent_pb2.SyncResponse,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.SyncResponse:
        kind = response.WhichOneof("frame")
        if kind not in ("delta", "content", "content_zstd"):
            return response
        data = bytearray(getattr(response, kind))
        at, damage = self.passed[-1], self.damage_at_byte
        if damage is not None and at <= damage < at + len(data):
            data[damage - at] ^= 0x55
            response = agent_pb2.SyncResponse(**{kind: bytes(data)})
        if self.cut_after_bytes is not None and at + len(data) > self.cut_after_bytes:
            self.cut_after_bytes = None  # once
            await context.abort(grpc.StatusCode.UNAVAILABLE, "relay cut the stream")
        self.passed[-1] += len(data)  # what reached the receiver
        return response
