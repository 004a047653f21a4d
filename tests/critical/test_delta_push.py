"""Delta pushes of critical writes against real agent processes and etcd (issue 13): a
new version of a large object reaches the replica as a delta over the version it
holds (the catalog's transfer record shows the wire bytes far below the logical
ones), and a replica that lost that basis gets it whole, still acked and bit-exact.

The last tests are unit tests (a fake replica on a loopback port, the owner's real
`SyncReplication` over a real store): a push answered `basis_missing` sends the
version whole within what is left of the push's deadline, never a fresh one."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from critical_helpers import put, stat
from harness.agent_process import AgentProcess
from harness.cli_schema import check_output
from harness.controllers import run_cli
from harness.fake_peers import StaticPeers, serving
from placements import critical
from waiting import until

from agents.admission import Admitted
from agents.replication.delta_push import DELTA_MIN_BYTES
from agents.replication.sync import SyncReplication
from agents.service import CommittedWrite
from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HybridClock
from controlplane.errors import UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

Agents = dict[str, AgentProcess]
MiB = 1 << 20


async def claim(coord: EtcdCoordination, dataset: str) -> None:
    epoch = await Ownership(coord).claim(
        dataset, "eu-west", expect_epoch=0, reason="home", actor="test"
    )
    assert epoch is not None


def edited(data: bytes, at: int, patch: bytes) -> bytes:
    return data[:at] + patch + data[at + len(patch) :]


async def transfer_to(
    env: dict[str, str], dataset: str, version: str, timeout_s: float = 30
) -> dict[str, object]:
    """The catalog's record of the copy of `version` into eu-central, once the agent's
    recorder has shipped it (polled, bounded)."""

    async def recorded() -> dict[str, object] | None:
        done = await asyncio.to_thread(
            run_cli, ["audit", "transfers", "--dataset", dataset, "-o", "json"], env
        )
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        check_output("audit_transfers", rows)
        found = [r for r in rows if r["version"] == version and r["to"] == "eu-central"]
        assert len(found) <= 1, found
        return dict(found[0]) if found else None

    what = f"a transfer of {dataset} at {version} to eu-central recorded"
    return await until(recorded, timeout_s, what=what, step_s=0.25)


@pytest.mark.integration
async def test_a_new_version_goes_as_a_delta_and_whole_to_a_replica_without_its_basis(
    eu_agents: Agents, coord: EtcdCoordination, critical_world: dict[str, str]
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    dataset = "pair/delta"
    await claim(coord, dataset)
    first = os.urandom(4 * MiB)
    v1 = await put(west.address, dataset, "weights", first)
    assert list(v1.regions) == ["eu-west", "eu-central"]
    whole = await transfer_to(critical_world, dataset, v1.version.hlc)
    assert whole["logical_bytes"] == 4 * MiB
    assert whole["wire_bytes"] >= 4 * MiB  # nothing to diff against: pushed whole

    second = edited(first, 3 * MiB, b"a fine-tuned layer" * 1000)
    v2 = await put(west.address, dataset, "weights", second)
    assert list(v2.regions) == ["eu-west", "eu-central"]
    held = await stat(central.address, dataset, "weights")
    assert held is not None and held.version.digest == v2.version.digest
    delta = await transfer_to(critical_world, dataset, v2.version.hlc)
    assert delta["logical_bytes"] == 4 * MiB
    assert 0 < int(delta["wire_bytes"]) < MiB // 4, delta  # the changed bytes and framing

    # eu-central loses everything (a new disk): the owner's basis is not there any
    # more, so the next version goes whole (the replica says so at once), still acked
    # by both, still exact.
    assert central.stop() == 0
    shutil.rmtree(central.root)
    central.start(timeout_s=120)  # a loaded machine may take long to start one
    third = edited(second, MiB, b"another step" * 500)
    v3 = await put(west.address, dataset, "weights", third)
    assert list(v3.regions) == ["eu-west", "eu-central"]
    async with grpc.aio.insecure_channel(central.address) as channel:
        got = b"".join(
            [
                m.chunk
                async for m in agent_pb2_grpc.AgentStub(channel).Get(
                    agent_pb2.GetRequest(dataset=dataset, key="weights"), timeout=30
                )
                if m.WhichOneof("frame") == "chunk"
            ]
        )
    assert got == third
    again = await transfer_to(critical_world, dataset, v3.version.hlc)
    assert int(again["wire_bytes"]) >= 4 * MiB


@pytest.mark.integration
async def test_a_replica_answers_basis_missing_before_reading_a_frame(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    dataset = "pair/nobasis"
    await claim(coord, dataset)
    v1 = await put(west.address, dataset, "k", os.urandom(256 * 1024))
    owner = await Ownership(coord).get(dataset)
    assert owner is not None

    async def frames() -> object:
        header = agent_pb2.ReplicateHeader(
            dataset=dataset,
            key="k",
            version=v1.version,
            epoch=owner.epoch,
            origin_region="eu-west",
            basis=agent_pb2.Basis(version="0000000000001.00000@eu-west", digest="blake3:00"),
        )
        yield agent_pb2.ReplicateRequest(header=header)
        yield agent_pb2.ReplicateRequest(delta=b"not a delta")

    async with grpc.aio.insecure_channel(central.address) as channel:
        resp = await agent_pb2_grpc.AgentStub(channel).Replicate(frames(), timeout=10)  # type: ignore[arg-type]
    assert resp.basis_missing
    assert resp.region == "eu-central"


PAIR = critical("pair/late", replicas=("eu-central",), policy="pair")


class LateBasisMissing(agent_pb2_grpc.AgentServicer):
    """A replica's Replicate (a fake port) that lost every basis: a delta is answered
    `basis_missing` after `slow_s`; a whole push is committed (the first `fail_whole`
    of them refused as unavailable instead), and the deadline it came with (the
    server's view of the time it had left) is kept."""

    def __init__(self, slow_s: float, fail_whole: int = 0) -> None:
        self.slow_s = slow_s
        self.fail_whole = fail_whole
        self.whole_had_s: list[float] = []
        self.pushes: list[str] = []  # "delta" or "whole", in order

    async def Replicate(  # noqa: N802 - the generated servicer's name
        self,
        request_iterator: AsyncIterator[agent_pb2.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ReplicateResponse:
        # Every frame read before answering: an early answer of a stream still sending
        # is what grpc/grpc#36066 hides, which is not what this test is about.
        frames = [f async for f in request_iterator]
        header = frames[0].header
        self.pushes.append("delta" if header.HasField("basis") else "whole")
        if header.HasField("basis"):
            await asyncio.sleep(self.slow_s)
            return agent_pb2.ReplicateResponse(region="eu-central", basis_missing=True)
        if self.fail_whole > 0:
            self.fail_whole -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the replica's disk is busy")
        remaining = context.time_remaining()
        assert remaining is not None
        self.whole_had_s.append(remaining)
        return agent_pb2.ReplicateResponse(region="eu-central", version=header.version)


@pytest.fixture
def west_store(tmp_path: Path) -> Iterator[ObjectStore]:
    opened = ObjectStore(tmp_path / "eu-west", clock=HybridClock("eu-west"))
    yield opened
    opened.close()


def second_version(store: ObjectStore) -> CommittedWrite:
    """A large key's second version: pushed as a delta over the first."""
    first = os.urandom(2 * DELTA_MIN_BYTES)
    store.put(PAIR.dataset, "k", [first])
    version = store.put(PAIR.dataset, "k", [edited(first, 100, b"changed")])
    return CommittedWrite(Admitted(PAIR, 1, 1), PAIR.dataset, key="k", version=version)


def recording_calls(sync: SyncReplication) -> list[float]:
    """The deadline of each Replicate call the owner's push makes."""
    deadlines: list[float] = []
    call = sync._replicate_call

    async def recorded(
        stub: agent_pb2_grpc.AgentAsyncStub,
        header: agent_pb2.ReplicateHeader,
        frames: AsyncGenerator[agent_pb2.ReplicateRequest],
        deadline_s: float,
        region: str,
        address: str,
    ) -> agent_pb2.ReplicateResponse:
        deadlines.append(deadline_s)
        return await call(stub, header, frames, deadline_s, region, address)

    sync._replicate_call = recorded  # type: ignore[method-assign]
    return deadlines


async def test_the_whole_push_after_basis_missing_gets_what_is_left_of_the_deadline(
    west_store: ObjectStore,
) -> None:
    """A push of 4 s whose delta is answered `basis_missing` after 1.5 s: the whole call
    gets at most the 2.5 s left (a fresh deadline gave it 4 s more). The lower bound is
    wide, for a loaded machine."""
    replica = LateBasisMissing(slow_s=1.5)
    write = second_version(west_store)
    async with serving({"eu-central": replica}) as peers:
        sync = SyncReplication(west_store, "eu-west", peers, timeout_s=10)
        deadlines = recording_calls(sync)
        try:
            assert await sync._push("eu-central", write, write.version, 4.0) == "eu-central"  # type: ignore[arg-type]
        finally:
            await sync.close()
    assert len(deadlines) == 2, deadlines
    assert 3.0 < deadlines[0] <= 4.0, deadlines  # less the address read and the basis
    assert 0.5 < deadlines[1] <= 2.5, deadlines
    # the replica was given that deadline too (as grpc carries it: never more)
    assert len(replica.whole_had_s) == 1
    assert replica.whole_had_s[0] <= 2.5, replica.whole_had_s


async def test_basis_missing_with_no_time_left_is_retriable_and_not_pushed_whole(
    west_store: ObjectStore,
) -> None:
    """The delta's answer came as the deadline ran out: no whole call is made (it would
    have had none of the deadline), and the error is retriable and names the push."""
    write = second_version(west_store)
    sync = SyncReplication(
        west_store, "eu-west", StaticPeers({"eu-central": "127.0.0.1:1"}), timeout_s=10
    )
    deadlines: list[float] = []

    async def late(
        stub: object, header: object, frames: AsyncGenerator[object], deadline_s: float, *a: str
    ) -> agent_pb2.ReplicateResponse:
        deadlines.append(deadline_s)
        await frames.aclose()
        started = time.monotonic()
        await asyncio.sleep(deadline_s)  # the answer takes the whole deadline
        assert time.monotonic() - started >= deadline_s
        return agent_pb2.ReplicateResponse(region="eu-central", basis_missing=True)

    sync._replicate_call = late  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(UnavailableError, match=r"pair/late/k at .* to eu-central") as caught:
            await sync._push("eu-central", write, write.version, 0.2)  # type: ignore[arg-type]
    finally:
        await sync.close()
    assert caught.value.retriable
    assert "basis_missing" in str(caught.value)
    assert len(deadlines) == 1 and deadlines[0] <= 0.2, deadlines  # the delta alone: no whole call


class SlowPeers(StaticPeers):
    """Peers whose address read takes `slow_s` (etcd under load)."""

    def __init__(self, peers: StaticPeers, slow_s: float) -> None:
        super().__init__(peers.addresses)
        self.slow_s = slow_s

    async def address(self, region: str) -> str:
        await asyncio.sleep(self.slow_s)
        return await super().address(region)


async def test_the_delta_call_gets_what_the_set_up_left_of_the_deadline(
    west_store: ObjectStore,
) -> None:
    """The replica's address took 1.5 s of a 4 s push: the delta call gets at most the
    2.5 s left, not 4 s more (the whole push then overran its bound by the set-up)."""
    replica = LateBasisMissing(slow_s=0)
    write = second_version(west_store)
    async with serving({"eu-central": replica}) as peers:
        sync = SyncReplication(west_store, "eu-west", SlowPeers(peers, 1.5), timeout_s=10)
        deadlines = recording_calls(sync)
        try:
            assert await sync._push("eu-central", write, write.version, 4.0) == "eu-central"  # type: ignore[arg-type]
        finally:
            await sync.close()
    assert replica.pushes == ["delta", "whole"]
    assert 0.5 < deadlines[0] <= 2.5, deadlines
    assert deadlines[1] <= deadlines[0], deadlines


async def test_after_basis_missing_a_retry_goes_whole_at_once(west_store: ObjectStore) -> None:
    """The delta was answered basis_missing and the whole push then failed: the retry of
    the same push goes whole at once (offered the same basis again, the replica would
    refuse it again and cost a round trip); once the replica committed a version, a
    newer one goes as a delta again."""
    replica = LateBasisMissing(slow_s=0, fail_whole=1)
    write = second_version(west_store)
    async with serving({"eu-central": replica}) as peers:
        sync = SyncReplication(west_store, "eu-west", peers, timeout_s=10)
        try:
            with pytest.raises(UnavailableError):
                await sync._push("eu-central", write, write.version, 4.0)  # type: ignore[arg-type]
            assert replica.pushes == ["delta", "whole"]
            assert await sync._push("eu-central", write, write.version, 4.0) == "eu-central"  # type: ignore[arg-type]
            assert replica.pushes == ["delta", "whole", "whole"]
            data = west_store.read_bytes(PAIR.dataset, "k")
            third = west_store.put(PAIR.dataset, "k", [edited(data, 9, b"again")])
            newer = CommittedWrite(write.admitted, PAIR.dataset, key="k", version=third)
            await sync._push("eu-central", newer, third, 4.0)  # type: ignore[arg-type]
        finally:
            await sync.close()
    assert replica.pushes == ["delta", "whole", "whole", "delta", "whole"]
