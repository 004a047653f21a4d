"""Shared scaffolding of the agent API tests: the world's placements, an in-process agent
(a real store in a tmp folder, in-memory policy and owners, a grpc.aio server on a free
loopback port) and small client helpers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from fakes.admission import MemoryOwners, StaticPolicy, compiled

from agents.admission import Admission, OwnerSource
from agents.metrics import AgentMetrics
from agents.replication.early_status import core_internal
from agents.service import AgentService, CommittedWrite, start_server, stop_server
from agents.store import ObjectStore
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from meridian.v1 import agent_pb2, agent_pb2_grpc

REGION = "eu-west"
REGIONS = {"eu-west": "EU", "eu-central": "EU", "us-east": "US"}
MiB = 1 << 20
TIMEOUT_S = 20.0
HIDDEN_ATTEMPTS = 5  # the same refused call, made again while grpc aio hides its status

STANDARD = "corpus/web"
CRITICAL = "ckpt/llama"
US_ONLY = "corpus/us"


def standard(name: str, residency: tuple[str, ...] = ("EU", "US"), home: str = REGION) -> Placement:
    others = tuple(r for r in REGIONS if r != home and REGIONS[r] in residency)
    return Placement(
        dataset=name,
        policy="corpus",
        dataset_class="standard",
        home=home,
        replicas=others,
        residency=residency,
        rpo_s=60,
        failover_mode="manual",
        failover_order=others,
    )


def critical(name: str) -> Placement:
    return Placement(
        dataset=name,
        policy="checkpoints",
        dataset_class="critical",
        home=REGION,
        replicas=("eu-central",),
        residency=("EU",),
        rpo_s=0,
        failover_mode="automatic",
        failover_order=("eu-central",),
    )


def world() -> list[Placement]:
    return [standard(STANDARD), critical(CRITICAL), standard(US_ONLY, ("US",), "us-east")]


class RecordingReplication:
    """The issue-13 seam, recording what it was handed."""

    def __init__(self) -> None:
        self.writes: list[CommittedWrite] = []

    async def replicate(self, write: CommittedWrite) -> None:
        self.writes.append(write)


@dataclass
class Agent:
    root: Path
    store: ObjectStore
    policy: StaticPolicy
    owners: MemoryOwners
    fence: FencedResource
    metrics: AgentMetrics
    service: AgentService
    server: grpc.aio.Server
    port: int
    channel: grpc.aio.Channel
    stub: agent_pb2_grpc.AgentStub
    replication: RecordingReplication = field(default_factory=RecordingReplication)

    def requests(self, call: str, code: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "meridian_agent_requests_total", {"call": call, "code": code}
        )
        return value or 0.0

    def sample(self, name: str, labels: dict[str, str]) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def files(self) -> list[str]:
        """Every file under objects/ and tmp/ (what a refused write must not leave)."""
        found: list[str] = []
        for sub in ("objects", "tmp"):
            for base, _, names in os.walk(self.root / sub):
                found.extend(os.path.join(base, n) for n in names)
        return found


async def start_agent(
    root: Path,
    *,
    max_object_bytes: int | None = None,
    owners_source: OwnerSource | None = None,
    fence: FencedResource | None = None,
) -> Agent:
    store = ObjectStore(root, clock=HybridClock(REGION))
    policy = StaticPolicy(compiled(REGIONS, world()))
    owners = MemoryOwners()
    owners.set(CRITICAL, REGION, 7)
    fence = fence or FencedResource()
    metrics = AgentMetrics(REGION, "agent-1")
    admission = Admission(REGION, policy, fence, owners_source or owners, metrics)
    replication = RecordingReplication()
    service = AgentService(
        store,
        admission,
        REGION,
        "agent-1",
        metrics,
        replication=replication,
        max_object_bytes=max_object_bytes,
    )
    server, port = await start_server(service, "127.0.0.1:0")
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.max_receive_message_length", 4 * MiB),
            ("grpc.max_send_message_length", 4 * MiB),
        ],
    )
    stub = agent_pb2_grpc.AgentStub(channel)
    return Agent(
        root,
        store,
        policy,
        owners,
        fence,
        metrics,
        service,
        server,
        port,
        channel,
        stub,
        replication,
    )


async def stop_agent(agent: Agent) -> None:
    await agent.channel.close()
    await stop_server(agent.server, None)
    agent.store.close()


def header(dataset: str, key: str, **fields: object) -> agent_pb2.PutRequest:
    return agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=dataset, key=key, **fields))  # type: ignore[arg-type]


async def frames(
    dataset: str, key: str, chunks: Iterable[bytes], *, end: bool = True, **fields: object
) -> AsyncIterator[agent_pb2.PutRequest]:
    yield header(dataset, key, **fields)
    for chunk in chunks:
        yield agent_pb2.PutRequest(chunk=chunk)
    if end:
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())


def split(data: bytes, size: int = MiB) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def put(
    agent: Agent, dataset: str, key: str, data: bytes, **fields: object
) -> agent_pb2.PutResponse:
    response: agent_pb2.PutResponse = await agent.stub.Put(
        frames(dataset, key, split(data), **fields), timeout=TIMEOUT_S
    )
    return response


async def get(
    agent: Agent, dataset: str, key: str, **fields: object
) -> tuple[agent_pb2.GetResponse, bytes]:
    call = agent.stub.Get(
        agent_pb2.GetRequest(dataset=dataset, key=key, **fields),  # type: ignore[arg-type]
        timeout=TIMEOUT_S,
    )
    first: agent_pb2.GetResponse | None = None
    body = bytearray()
    async for msg in call:
        if first is None:
            assert msg.WhichOneof("frame") == "header"
            first = msg
        else:
            assert msg.WhichOneof("frame") == "chunk"
            assert len(msg.chunk) <= MiB
            body += msg.chunk
    assert first is not None
    return first, bytes(body)


async def refusal(call: Callable[[], Awaitable[object]]) -> tuple[grpc.aio.AioRpcError, int]:
    """The agent's refusal of `call()` and how many calls it took to read it.

    grpc aio (grpc/grpc#36066) sometimes reports a server's early status on a client
    stream that is still sending as INTERNAL "Internal error from Core". A refusal
    stores nothing and the agent counts it under its own code, so on that INTERNAL the
    same call is made again, a bounded number of times; tests that count requests
    compare with the calls made."""
    for calls in range(1, HIDDEN_ATTEMPTS + 1):
        try:
            await call()
        except grpc.aio.AioRpcError as err:
            if core_internal(err) and calls < HIDDEN_ATTEMPTS:
                continue
            return err, calls
        raise AssertionError(f"call {calls} was accepted; a refusal was expected")
    raise AssertionError("unreachable: the last attempt returns or raises")
