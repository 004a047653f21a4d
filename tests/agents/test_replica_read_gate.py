"""A replica's owner read for a pushed batch (agents/replication/replica_pushes.py) runs
while the store stages the bytes, and the rows commit only once it has passed: a read
that refuses, or that etcd cannot answer, leaves nothing stored. Unit level: a real
store and a real `Admission`, the etcd read a test-controlled coroutine."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_api_helpers import CRITICAL, REGIONS, world
from fakes.admission import MemoryOwners, StaticPolicy, compiled
from waiting import until

from agents.admission import Admission, OwnerRecord
from agents.metrics import AgentMetrics
from agents.replication import replica_pushes
from agents.replication.replica_pushes import ReplicaPushes
from agents.store import ObjectStore
from agents.store.model import ApplyResult
from agents.store.staging import TMP
from agents.store.store import INLINE_MAX_BYTES
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HybridClock, offset_ms
from controlplane.domain.version import Digest, Version
from controlplane.errors import UnavailableError
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2

HERE, OWNER, EPOCH = "eu-central", "eu-west", 7
WAIT_S = 10.0
# Over the store's inline limit, so that the bytes are staged in a file the test can
# see (a smaller copy is checked in memory and kept in the database).
SHARD = b"one shard of a checkpoint " * (INLINE_MAX_BYTES // 26 + 1)


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


def request(
    data: bytes, *, ahead_ms: int = 0, digest: Digest | None = None
) -> tuple[agent_pb2.ReplicatePushesRequest, Version]:
    hlc = HybridClock(OWNER, physical_ms=offset_ms(ahead_ms)).now()
    version = Version.put(hlc, len(data), digest or Digest.of(data))
    header = agent_pb2.ReplicateHeader(
        dataset=CRITICAL,
        key="shard-0",
        version=version_to_wire(version),
        epoch=EPOCH,
        origin_region=OWNER,
    )
    item = agent_pb2.PushedItem(header=header, data=data)
    return agent_pb2.ReplicatePushesRequest(items=[item]), version


def refused_transfers(metrics: AgentMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "meridian_transfers_total", {"direction": "in", "outcome": "refused"}
    )
    return value or 0.0


def staged_files(store: ObjectStore) -> list[Path]:
    return sorted((store.root / TMP).glob("*"))


async def test_the_bytes_are_staged_during_the_owner_read_and_committed_after_it(
    tmp_path: Path,
) -> None:
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    pushes, store, _ = replica(tmp_path / "store", read)
    try:
        req, version = request(SHARD, ahead_ms=500)
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
        assert store.read_bytes(CRITICAL, "shard-0") == SHARD
        assert staged_files(store) == []
        assert store.clock.now() > version.hlc  # an admitted copy is observed
    finally:
        read.release.set()  # a thread parked at the gate must not outlive the test
        store.close()


async def test_an_owner_read_naming_a_newer_owner_refuses_and_stores_nothing(
    tmp_path: Path,
) -> None:
    read = GatedRead(OwnerRecord(CRITICAL, "eu-north", EPOCH + 1))
    pushes, store, metrics = replica(tmp_path / "store", read)
    try:
        req, _ = request(SHARD)
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
        assert refused_transfers(metrics) == 1
        (record,) = [e for e in store.journal_pending() if e.kind == "transfer"]
        assert record.data["outcome"] == "refused", record
        assert f"epoch {EPOCH + 1}" in str(record.data["reason"]), record  # the read's fence
    finally:
        read.release.set()  # a thread parked at the gate must not outlive the test
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
        read.release.set()  # a thread parked at the gate must not outlive the test
        store.close()


async def test_a_refused_copy_that_fails_before_the_gate_is_still_refused_per_item(
    tmp_path: Path,
) -> None:
    """A deposed owner's push whose bytes do not match its digest: the read's fence is
    the answer (per item, as when the read came first), not a whole-call error; and a
    refused copy does not move the replica's clock."""
    read = GatedRead(OwnerRecord(CRITICAL, "eu-north", EPOCH + 1))
    read.release.set()
    pushes, store, metrics = replica(tmp_path / "store", read)
    try:
        req, version = request(b"bytes", ahead_ms=500, digest=Digest.of(b"other bytes"))
        (result,) = (await asyncio.wait_for(pushes.receive(req), WAIT_S)).results
        assert result.error_class == "StaleEpochError", result
        assert refused_transfers(metrics) == 1
        assert store.head(CRITICAL, "shard-0") is None
        assert staged_files(store) == []
        assert store.clock.now() < version.hlc  # 0.5 s ahead, and never observed
    finally:
        store.close()


async def test_past_gated_most_calls_read_first_then_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each gated call holds a store thread while etcd answers: past `GATED_MOST` at
    once, a call reads first and applies without a gate (no thread waits on etcd)."""
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    read.release.set()
    pushes, store, _ = replica(tmp_path / "store", read)
    gates: list[bool] = []
    real = store.apply_many

    def noted(*args: Any, **kwargs: Any) -> list[ApplyResult]:
        gates.append(kwargs.get("gate") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "apply_many", noted)
    try:
        req, _ = request(b"gated")
        assert not (await asyncio.wait_for(pushes.receive(req), WAIT_S)).results[0].error_class
        monkeypatch.setattr(replica_pushes, "GATED_MOST", 0)
        req, version = request(b"read first")
        (result,) = (await asyncio.wait_for(pushes.receive(req), WAIT_S)).results
        assert not result.error_class, result
        assert gates == [True, False]
        assert store.head(CRITICAL, "shard-0") == version
    finally:
        store.close()


async def test_a_new_owner_s_listing_waits_for_a_push_past_its_owner_read(
    tmp_path: Path,
) -> None:
    """Between a pushed batch's owner read and its commit, a complete listing of the
    dataset waits (Admission.received): it lists the copy once committed, never just
    before the replica acks it to a deposed owner."""
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    pushes, store, _ = replica(tmp_path / "store", read)
    try:
        req, version = request(SHARD)
        call = asyncio.create_task(pushes.receive(req))
        await asyncio.wait_for(read.started.wait(), WAIT_S)
        listing = asyncio.create_task(pushes.admission.received(CRITICAL))
        await asyncio.sleep(0.05)  # the window: the listing must still wait
        assert not listing.done()
        read.release.set()
        await asyncio.wait_for(listing, WAIT_S)
        assert store.head(CRITICAL, "shard-0") == version  # committed by then
        await asyncio.wait_for(call, WAIT_S)
    finally:
        read.release.set()
        store.close()


@pytest.mark.parametrize("past_gate", [False, True], ids=["before-gate", "past-gate"])
async def test_a_cancelled_push_holds_a_listing_until_its_thread_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, past_gate: bool
) -> None:
    """A call cancelled while its store thread runs (its deadline, the server stopping)
    stays registered until the thread has ended (agents/to_the_end.py): before the gate
    the thread stores nothing, past it the copy commits, and a new owner's listing
    goes only after either."""
    read = GatedRead(OwnerRecord(CRITICAL, OWNER, EPOCH))
    pushes, store, _ = replica(tmp_path / "store", read)
    entered, release = threading.Event(), threading.Event()
    real_gate = replica_pushes._passed

    def held_gate(*args: Any) -> None:
        if past_gate:
            real_gate(*args)
        entered.set()
        release.wait(WAIT_S * 2)
        if not past_gate:
            real_gate(*args)

    monkeypatch.setattr(replica_pushes, "_passed", held_gate)
    if past_gate:
        read.release.set()
    try:
        req, version = request(SHARD)
        call = asyncio.create_task(pushes.receive(req))
        await until(entered.is_set, WAIT_S, "the store's thread is at its gate")
        listing = asyncio.create_task(pushes.admission.received(CRITICAL))
        call.cancel()
        await asyncio.sleep(0.2)  # the window: the listing must still wait
        assert not listing.done()
        release.set()
        read.release.set()  # before the gate, the read was cancelled with the call
        await asyncio.wait_for(listing, WAIT_S)
        assert store.head(CRITICAL, "shard-0") == (version if past_gate else None)
        with pytest.raises(asyncio.CancelledError):
            await call
        assert staged_files(store) == []
    finally:
        release.set()
        read.release.set()
        store.close()
