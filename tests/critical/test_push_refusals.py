"""How the owner answers when its pushes fail (agents/replication/sync.py), against
in-process replica servers that refuse or stall (units: the replicas are a faked
port, the owner's store is real):

* a replica's stale refusal of a write admitted at an epoch this region has since
  re-claimed (the ownership watch had not delivered it) is answered retriable; only a
  real loss of ownership stays a non-retriable `StaleEpochError`;
* a replica whose push failed is marked behind the moment it fails, not when that
  write's wait for its quorum ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from placements import critical
from waiting import until

from agents.admission import Admitted, OwnerRecord
from agents.replication.sync import SyncReplication
from agents.rpc.status import abort
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import FencedError, MeridianError, UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

DATASET = "ckpt/refusals"
OWNER = "eu-west"
REPLICAS = ("eu-central", "eu-north")


class Replica(agent_pb2_grpc.AgentServicer):
    """A replica agent whose Replicate answers `verdict` (an error, or None: commits)
    once `release` is set."""

    def __init__(self, region: str, verdict: MeridianError | None) -> None:
        self.region = region
        self.verdict = verdict
        self.release = asyncio.Event()
        self.release.set()
        self.pushes = 0

    async def Replicate(  # noqa: N802 - the generated name
        self,
        request_iterator: AsyncIterator[agent_pb2.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ReplicateResponse:
        first = await anext(request_iterator)
        async for _ in request_iterator:
            pass
        self.pushes += 1
        await asyncio.wait_for(self.release.wait(), timeout=10)
        if self.verdict is not None:
            await abort(context, self.verdict)
        return agent_pb2.ReplicateResponse(version=first.header.version, region=self.region)

    async def List(  # noqa: N802
        self, request: agent_pb2.ListRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> agent_pb2.ListResponse:
        await abort(context, UnavailableError("this test replica lists nothing"))
        raise AssertionError("abort returns only by raising")


class Addresses:
    def __init__(self, known: dict[str, str]) -> None:
        self.known = known

    async def address(self, region: str) -> str:
        return self.known[region]

    def forget(self, region: str) -> None:
        pass


def placement() -> Placement:
    return critical(
        DATASET, home=OWNER, replicas=REPLICAS, policy="checkpoints", failover_mode="automatic"
    )


async def owner_with(
    tmp_path: Path,
    replicas: dict[str, Replica],
    owner_now: Callable[[str], Awaitable[OwnerRecord | None]] | None,
    run: Callable[[SyncReplication, CommittedWrite], Awaitable[None]],
) -> None:
    """An owner at epoch 5 that committed one write, pushing to `replicas`."""
    servers: list[grpc.aio.Server] = []
    known: dict[str, str] = {}
    store = ObjectStore(tmp_path / "owner", clock=HybridClock(OWNER))
    sync: SyncReplication | None = None
    try:
        for region, servicer in replicas.items():
            server = grpc.aio.server()
            agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            known[region] = f"127.0.0.1:{port}"
        staged = store.stage(DATASET, "k")
        staged.write(b"payload")
        version = store.commit_put(staged, outbox=False, epoch=5, policy_revision=1)
        admitted = Admitted(placement(), 5, 1)
        write = CommittedWrite(admitted, DATASET, key="k", version=version)
        sync = SyncReplication(store, OWNER, Addresses(known), timeout_s=5, owner_now=owner_now)
        sync.retry_initial_s = sync.retry_max_s = 5.0  # no catch-up round within the test
        await run(sync, write)
    finally:
        if sync is not None:
            await sync.close()
        for server in servers:
            await server.stop(None)
        store.close()


def stale() -> StaleEpochError:
    return StaleEpochError(f"write to {DATASET} carried epoch 5, older than its current epoch 9")


async def test_a_stale_refusal_of_a_write_this_region_reclaimed_is_retriable(
    tmp_path: Path,
) -> None:
    asked: list[str] = []

    async def owner_now(dataset: str) -> OwnerRecord | None:
        asked.append(dataset)
        return OwnerRecord(dataset, OWNER, 9)  # re-claimed by this very region

    async def run(sync: SyncReplication, write: CommittedWrite) -> None:
        with pytest.raises(MeridianError) as raised:
            await sync.replicate(write)
        assert not isinstance(raised.value, FencedError), f"non-retriable: {raised.value}"
        assert isinstance(raised.value, UnavailableError)
        assert "re-claimed" in str(raised.value) and "epoch 9" in str(raised.value)

    replicas = {r: Replica(r, stale()) for r in REPLICAS}
    await owner_with(tmp_path, replicas, owner_now, run)
    assert asked == [DATASET]


@pytest.mark.parametrize(
    "record",
    [OwnerRecord(DATASET, "eu-north", 9), None, OwnerRecord(DATASET, OWNER, 5)],
    ids=["another-region", "no-owner", "same-epoch"],
)
async def test_a_stale_refusal_after_a_real_loss_of_ownership_stays_fenced(
    tmp_path: Path, record: OwnerRecord | None
) -> None:
    async def owner_now(dataset: str) -> OwnerRecord | None:
        return record

    async def run(sync: SyncReplication, write: CommittedWrite) -> None:
        with pytest.raises(StaleEpochError):
            await sync.replicate(write)

    replicas = {r: Replica(r, stale()) for r in REPLICAS}
    await owner_with(tmp_path, replicas, owner_now, run)


async def test_a_replica_whose_push_failed_is_behind_before_the_write_is_answered(
    tmp_path: Path,
) -> None:
    """eu-central fails at once while eu-north stalls: the write still waits for its
    quorum, and eu-central must be behind already (a later write's push to it would
    otherwise count a region lacking this one)."""
    slow = Replica("eu-north", None)
    slow.release.clear()
    replicas = {
        "eu-central": Replica("eu-central", UnavailableError("disk full")),
        "eu-north": slow,
    }

    async def run(sync: SyncReplication, write: CommittedWrite) -> None:
        answer = asyncio.create_task(sync.replicate(write))
        await until(lambda: slow.pushes == 1, timeout_s=5, what="the stalled push arrived")
        await until(
            lambda: sync.behind(DATASET) == ["eu-central"],
            timeout_s=5,
            what="eu-central marked behind",
        )
        assert not answer.done(), "the write was answered before its quorum's wait ended"
        slow.release.set()
        assert await asyncio.wait_for(answer, timeout=5) == (OWNER, "eu-north")

    await owner_with(tmp_path, replicas, None, run)


class BatchReplica(agent_pb2_grpc.AgentServicer):
    """A replica agent taking ReplicatePushes: it commits every item it gets, or, with
    `blank`, answers each with an empty result (neither a version nor an error)."""

    def __init__(self, region: str, *, blank: bool = False) -> None:
        self.region = region
        self.blank = blank
        self.keys: list[str] = []

    async def ReplicatePushes(  # noqa: N802 - the generated name
        self,
        request: agent_pb2.ReplicatePushesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ReplicatePushesResponse:
        self.keys += [item.header.key for item in request.items]
        results = [
            agent_pb2.ReplicateItemResult()
            if self.blank
            else agent_pb2.ReplicateItemResult(held=item.header.version)
            for item in request.items
        ]
        return agent_pb2.ReplicatePushesResponse(results=results, region=self.region)


def two_writes(store: ObjectStore, write: CommittedWrite) -> list[tuple[CommittedWrite, Version]]:
    """The test's committed write, and one of another key whose version the owner no
    longer holds (superseded and pruned while its push waited in the queue)."""
    assert write.version is not None
    gone = replace(write.version, hlc=HLC.parse(f"1000000000000.00000@{OWNER}"))
    other = CommittedWrite(write.admitted, DATASET, key="pruned", version=gone)
    return [(other, gone), (write, write.version)]


async def test_a_batch_item_whose_version_is_gone_fails_alone(tmp_path: Path) -> None:
    replica = BatchReplica("eu-central")

    async def run(sync: SyncReplication, write: CommittedWrite) -> None:
        answers = await sync._push_many("eu-central", two_writes(sync.store, write), 5.0)
        assert isinstance(answers[0], MeridianError), answers
        assert answers[1] is None, f"the held write failed with the gone one: {answers[1]}"
        assert replica.keys == ["k"]

    await owner_with(tmp_path, {"eu-central": replica}, None, run)


async def test_a_batch_result_with_neither_version_nor_error_is_not_held(tmp_path: Path) -> None:
    replica = BatchReplica("eu-central", blank=True)

    async def run(sync: SyncReplication, write: CommittedWrite) -> None:
        assert write.version is not None
        answers = await sync._push_many("eu-central", [(write, write.version)], 5.0)
        assert isinstance(answers[0], UnavailableError), answers

    await owner_with(tmp_path, {"eu-central": replica}, None, run)
