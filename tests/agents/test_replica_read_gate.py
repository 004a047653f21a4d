"""A replica's owner read for a pushed batch (agents/replication/replica_pushes.py) runs
while the store stages the bytes, and the rows commit only once it has passed: a read
that refuses, or that etcd cannot answer, leaves nothing stored. Unit level: a real
store and a real `Admission`, the etcd read a test-controlled coroutine."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_api_helpers import CRITICAL, REGIONS, world
from fakes.admission import MemoryOwners, StaticPolicy, compiled
from waiting import until

from agents.admission import Admission, OwnerRecord
from agents.metrics import AgentMetrics
from agents.replication.replica_pushes import ReplicaPushes
from agents.store import ObjectStore
from agents.store.staging import TMP
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Digest, Version
from controlplane.errors import UnavailableError
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2

HERE, OWNER, EPOCH = "eu-central", "eu-west", 7
WAIT_S = 10.0


class GatedRead:
    """The fresh etcd read of the owner, held until the test releases it."""

    def __init__(self, answer: OwnerRecord | None) -> None:
        self.answer = answer
        self.unavailable = False
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, dataset: str) -> OwnerRecord | None:
        self.started.set()
        await self.release.wait()
        if self.unavailable:
            raise UnavailableError(f"the owner of {dataset} cannot be read from etcd (test)")
        return self.answer


def replica(root: Path, read: GatedRead) -> tuple[ReplicaPushes, ObjectStore, AgentMetrics]:
    cached = MemoryOwners()
    cached.set(CRITICAL, OWNER, EPOCH)
    policy = compiled(REGIONS, world())
    metrics = AgentMetrics(HERE)
    admission = Admission(
        HERE, StaticPolicy(policy), FencedResource(), cached, metrics, fresh_owner=read
    )
    store = ObjectStore(root, clock=HybridClock(HERE))
    return ReplicaPushes(store, admission, HERE, metrics, lambda: policy), store, metrics


def request(data: bytes) -> tuple[agent_pb2.ReplicatePushesRequest, Version]:
    version = Version.put(HybridClock(OWNER).now(), len(data), Digest.of(data))
    header = agent_pb2.ReplicateHeader(
        dataset=CRITICAL,
        key="shard-0",
        version=version_to_wire(version),
        epoch=EPOCH,
        origin_region=OWNER,
    )
    item = agent_pb2.PushedItem(header=header, data=data)
    return agent_pb2.ReplicatePushesRequest(items=[item]), version


def staged_files(store: ObjectStore) -> list[Path]:
    return sorted((store.root / TMP).glob("*"))


async def test_the_bytes_are_staged_during_the_owner_read_and_committed_after_it(
    tmp_path: Path,
) -> None:
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    pushes, store, _ = replica(tmp_path / "store", read)
    try:
        req, version = request(b"one shard of a checkpoint")
        call = asyncio.create_task(pushes.receive(req))
        await asyncio.wait_for(read.started.wait(), WAIT_S)
        # The read is still running: the bytes are staged meanwhile, not committed.
        await until(lambda: staged_files(store), WAIT_S, "a staged temporary file", step_s=0.002)
        assert store.head(CRITICAL, "shard-0") is None
        assert not call.done()
        read.release.set()
        resp = await asyncio.wait_for(call, WAIT_S)
        (result,) = resp.results
        assert not result.error_class, result
        assert result.held.hlc == version_to_wire(version).hlc
        assert store.head(CRITICAL, "shard-0") == version
        assert store.read_bytes(CRITICAL, "shard-0") == b"one shard of a checkpoint"
        assert staged_files(store) == []
    finally:
        store.close()


async def test_an_owner_read_naming_a_newer_owner_refuses_and_stores_nothing(
    tmp_path: Path,
) -> None:
    read = GatedRead(OwnerRecord(CRITICAL, "eu-north", EPOCH + 1))
    pushes, store, metrics = replica(tmp_path / "store", read)
    try:
        req, _ = request(b"pushed by a deposed owner")
        call = asyncio.create_task(pushes.receive(req))
        await asyncio.wait_for(read.started.wait(), WAIT_S)
        await until(lambda: staged_files(store), WAIT_S, "a staged temporary file", step_s=0.002)
        read.release.set()
        (result,) = (await asyncio.wait_for(call, WAIT_S)).results
        assert result.error_class == "StaleEpochError", result
        assert not result.HasField("held")
        assert store.head(CRITICAL, "shard-0") is None
        assert staged_files(store) == []  # the staged bytes were dropped
        stale = metrics.registry.get_sample_value(
            "meridian_stale_epoch_refused_total", {"dataset": CRITICAL}
        )
        assert stale == 1
    finally:
        store.close()


async def test_an_owner_read_etcd_cannot_answer_refuses_retriably_and_stores_nothing(
    tmp_path: Path,
) -> None:
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    read.unavailable = True
    read.release.set()
    pushes, store, _ = replica(tmp_path / "store", read)
    try:
        req, _ = request(b"etcd is away")
        (result,) = (await asyncio.wait_for(pushes.receive(req), WAIT_S)).results
        assert result.error_class == "UnavailableError", result
        assert result.error_code == "UNAVAILABLE"
        assert store.head(CRITICAL, "shard-0") is None
        assert staged_files(store) == []
    finally:
        store.close()
