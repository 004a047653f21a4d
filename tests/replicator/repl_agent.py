"""A stand-in agent for the replicator's integration tests: the real `ObjectStore`
behind a grpc.aio server that answers `Replicate` (epoch 0: a standard copy by LWW)
and `Stat`, the calls the replicator makes for inline events and deletes.

Until the agent's servicer is on main (agents/service), this is how the replicator
meets a real store over real gRPC. `effects(dataset, key, hlc)` counts the store's
journal rows of that version: one per stored version, so a second effect shows.
`hold_after_commit`, when set, makes a call wait after its commit and before its
answer (the window in which a replicator crash must replay as a no-op).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agents.rpc.status import abort
from agents.store.store import ObjectStore
from controlplane.domain.hlc import HybridClock
from controlplane.errors import MeridianError
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc


class StandInAgent(agent_pb2_grpc.AgentServicer):
    def __init__(self, root: Path, region: str) -> None:
        self.region = region
        self.store = ObjectStore(root, clock=HybridClock(region))
        self.commits = 0
        self.applied: list[tuple[str, str, str]] = []  # (dataset, key, hlc) of each commit
        self.changed = asyncio.Condition()  # notified at each commit
        self.hold_after_commit: asyncio.Event | None = None

    def close(self) -> None:
        self.store.close()

    def commits_of(self, dataset: str) -> int:
        """Calls answered for `dataset` (replays included): other tests' leftovers aside."""
        return sum(1 for ds, _, _ in self.applied if ds == dataset)

    def effects(self, dataset: str, key: str, hlc: str) -> int:
        return sum(
            1
            for e in self.store.journal_pending(limit=1_000_000)
            if e.kind == "version" and (e.dataset, e.key, e.hlc) == (dataset, key, hlc)
        )

    async def Health(  # noqa: N802 - the generated servicer's name
        self,
        request: agent_pb2.HealthRequest,
        context: grpc.aio.ServicerContext[agent_pb2.HealthRequest, agent_pb2.HealthResponse],
    ) -> agent_pb2.HealthResponse:
        return agent_pb2.HealthResponse(live=True, region=self.region, agent_id="stand-in")

    async def Replicate(  # noqa: N802 - the generated servicer's name
        self,
        request_iterator: AsyncIterator[agent_pb2.ReplicateRequest],
        context: grpc.aio.ServicerContext[agent_pb2.ReplicateRequest, agent_pb2.ReplicateResponse],
    ) -> agent_pb2.ReplicateResponse:
        header: agent_pb2.ReplicateHeader | None = None
        chunks: list[bytes] = []
        async for frame in request_iterator:
            if frame.HasField("header"):
                header = frame.header
            else:
                chunks.append(frame.chunk)
        if header is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no header")
            raise AssertionError
        try:
            version = version_from_wire(header.version)
            source = None if version.is_tombstone else [b"".join(chunks)]
            result = await asyncio.to_thread(
                self.store.apply, header.dataset, header.key, version, source
            )
        except MeridianError as exc:
            await abort(context, exc)
        self.commits += 1
        self.applied.append((header.dataset, header.key, str(version.hlc)))
        async with self.changed:
            self.changed.notify_all()
        if self.hold_after_commit is not None:
            await self.hold_after_commit.wait()
        return agent_pb2.ReplicateResponse(
            version=version_to_wire(result.newest), region=self.region
        )

    async def Stat(  # noqa: N802
        self,
        request: agent_pb2.StatRequest,
        context: grpc.aio.ServicerContext[agent_pb2.StatRequest, agent_pb2.StatResponse],
    ) -> agent_pb2.StatResponse:
        held = self.store.head(request.dataset, request.key)
        if held is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such object")
        return agent_pb2.StatResponse(
            object=agent_pb2.ObjectInfo(
                dataset=request.dataset, key=request.key, version=version_to_wire(held)
            )
        )


async def serve(agent: StandInAgent) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
