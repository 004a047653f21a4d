"""Agents in the test's process: a store in a folder, a fake admission, the
TransferService behind a real grpc.aio server on a free port (until the daemon's
process harness lands; see contracts.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
from fakes.admission import MemoryOwners, StaticPolicy

from agents.admission import Admission
from agents.metrics import AgentMetrics
from agents.store import ObjectStore
from agents.transfer.limiter import LinkLimiter
from agents.transfer.pull import CHANNEL_OPTIONS
from agents.transfer.service import TransferService
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy, Link
from meridian.v1 import agent_pb2_grpc

REGIONS = {"eu-west": "EU", "eu-central": "EU", "eu-north": "EU", "us-east": "US"}


def placement(dataset: str, **overrides: object) -> Placement:
    fields: dict[str, object] = {
        "dataset": dataset,
        "policy": "test",
        "dataset_class": "standard",
        "home": "eu-west",
        "replicas": ("eu-central",),
        "residency": ("EU",),
        "rpo_s": 60.0,
        "failover_mode": "manual",
        "failover_order": (),
    }
    fields.update(overrides)
    if fields["dataset_class"] == "critical":
        fields["rpo_s"] = 0.0
    return Placement(**fields)  # type: ignore[arg-type]


RTT_S = {("eu-west", "eu-central"): 0.01, ("eu-north", "eu-central"): 0.03}


def compiled(
    placements: Mapping[str, Placement], regions: Mapping[str, str] = REGIONS
) -> CompiledPolicy:
    links = {frozenset(pair): Link(frozenset(pair), rtt, None) for pair, rtt in RTT_S.items()}
    return CompiledPolicy(
        digest="test",
        revision=1,
        applied_at=datetime.now(UTC),
        regions=dict(regions),
        links=links,
        placements=dict(placements),
        rules={},
    )


class _Servicer(agent_pb2_grpc.AgentServicer):
    """Only the transfer calls, delegated as the agent's servicer does."""

    def __init__(self, service: TransferService) -> None:
        self.Signature = service.Signature  # type: ignore[method-assign]
        self.Sync = service.Sync  # type: ignore[method-assign]
        self.Replicate = service.Replicate  # type: ignore[method-assign]
        self.Fetch = service.Fetch  # type: ignore[method-assign]
        self.SyncBundle = service.SyncBundle  # type: ignore[method-assign]
        self.FetchMany = service.FetchMany  # type: ignore[method-assign]


@dataclass
class Agent:
    region: str
    root: Path
    store: ObjectStore
    metrics: AgentMetrics
    admission: Admission
    fence: FencedResource
    owners: MemoryOwners
    service: TransferService
    server: grpc.aio.Server
    address: str

    async def stop(self) -> None:
        await self.server.stop(grace=None)
        self.store.close()


async def start_agent(
    root: Path,
    region: str,
    placements: dict[str, Placement],
    *,
    regions: Mapping[str, str] = REGIONS,
    limiter: LinkLimiter | None = None,
    checkpoint_bytes: int = 1 << 20,
    keep_versions: int = 2,
    bundle_max_bytes: int = 1 << 20,
) -> Agent:
    store = ObjectStore(root, clock=HybridClock(region), keep_versions=keep_versions)
    metrics = AgentMetrics(region, f"{region}-1")
    policy = compiled(placements, regions)
    fence, owners = FencedResource(), MemoryOwners()
    admission = Admission(region, StaticPolicy(policy), fence, owners, metrics)
    service = TransferService(
        store,
        admission,
        region,
        metrics,
        limiter,
        lambda: policy,
        checkpoint_bytes=checkpoint_bytes,
        bundle_max_bytes=bundle_max_bytes,
    )
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    agent_pb2_grpc.add_AgentServicer_to_server(_Servicer(service), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    return Agent(region, root, store, metrics, admission, fence, owners, service, server, address)


AgentFactory = Callable[..., Awaitable[Agent]]
