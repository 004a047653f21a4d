"""Fake ports of an owner's `SyncReplication` for unit tests: its `Peers` (a fixed
address per region) and fake replica agents served on loopback ports (test scaffolding:
a servicer that answers `Replicate` as a test needs it, not a real agent)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import grpc

from meridian.v1 import agent_pb2_grpc


class StaticPeers:
    """The owner's `Peers` (agents/replication/peers.py): the one agent of each region
    it is told to ask, at a fixed address."""

    def __init__(self, addresses: Mapping[str, str]) -> None:
        self.addresses = dict(addresses)

    async def address(self, region: str) -> str:
        return self.addresses[region]

    def forget(self, region: str) -> None:
        pass  # fixed addresses: nothing to read from etcd again


@contextlib.asynccontextmanager
async def serving(
    servicers: Mapping[str, agent_pb2_grpc.AgentServicer],
) -> AsyncIterator[StaticPeers]:
    """Serve each region's fake agent on a loopback port of its own, for the block;
    the owner's `Peers` naming them. Every server started is stopped at the end."""
    servers: list[grpc.aio.Server] = []
    addresses: dict[str, str] = {}
    try:
        for region, servicer in servicers.items():
            server = grpc.aio.server()
            agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
            servers.append(server)  # stopped at the end even if its start fails
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            addresses[region] = f"127.0.0.1:{port}"
        yield StaticPeers(addresses)
    finally:
        for server in servers:
            await server.stop(None)
