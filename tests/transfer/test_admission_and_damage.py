"""Refusals and damage: residency at the receiver and at the sender (each recorded
where it happened), a byte damaged in transit (DATA_LOSS, nothing stored), a stale
epoch on Replicate (FAILED_PRECONDITION), standard Replicate and tombstones."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from agents_inproc import REGIONS, AgentFactory
from harness.raw_replicate import replicate_raw
from waiting import until
from xfer_helpers import content, fetch, rewrite, transfers
from xfer_relay import Relay

from agents.errors import NotGovernedError, ResidencyError
from agents.transfer.pull import CHANNEL_OPTIONS
from agents.transfer.resume import ResumeState
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import NotFoundError
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc


async def test_receiver_outside_the_residency_refuses_and_records(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    east = await agents("us-east")
    version = west.store.put("ckpt", "a", [b"eu only"])

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch(east.address, "ckpt", "a", version, [("eu-west", west.address)])

    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert east.store.head("ckpt", "a") is None
    [record] = transfers(east.store)
    assert record["outcome"] == "refused"
    assert record["to_jurisdiction"] == "US"
    assert transfers(west.store) == []  # nothing was asked of the sender
    refused = east.metrics.residency_refused.labels(dataset="ckpt", direction="receive")
    assert refused._value.get() == 1


async def test_a_refused_fetch_removes_what_an_earlier_attempt_kept(agents: AgentFactory) -> None:
    """A partial copy kept for a resume goes when the copy is refused (a residency that
    was narrowed since), not after a day and a restart (review)."""
    west = await agents("eu-west")
    east = await agents("us-east")
    version = west.store.put("ckpt", "b", [b"eu only"])
    hlc = version.hlc.text
    east.service.book.save(ResumeState("t1", "ckpt", "b", hlc, "raw", "", 4, 4, time.time()))
    east.service.book.partial_path("ckpt", "b", hlc).write_bytes(b"eu o")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch(east.address, "ckpt", "b", version, [("eu-west", west.address)])

    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert east.service.book.load("ckpt", "b", hlc) is None
    assert not east.service.book.partial_path("ckpt", "b", hlc).exists()


async def test_sender_refuses_a_region_outside_the_residency(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    # A receiver whose policy is stale: it believes us-east is in the EU.
    east = await agents("us-east", regions={**REGIONS, "us-east": "EU"})
    version = west.store.put("ckpt", "a", [b"eu only"])

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch(east.address, "ckpt", "a", version, [("eu-west", west.address)])

    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert east.store.head("ckpt", "a") is None
    [record] = transfers(west.store)
    assert (record["outcome"], record["to_region"], record["to_jurisdiction"]) == (
        "refused",
        "us-east",
        "US",
    )
    refused = west.metrics.residency_refused.labels(dataset="ckpt", direction="send")
    assert refused._value.get() == 1


@pytest.mark.parametrize("with_basis", [False, True], ids=["raw", "delta"])
async def test_a_byte_damaged_in_transit_is_data_loss_and_nothing_is_stored(
    agents: AgentFactory, with_basis: bool
) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central")
    old = content(4 << 20)
    if with_basis:
        v1 = west.store.put("ckpt", "m", [old])
        await fetch(central.address, "ckpt", "m", v1, [("eu-west", west.address)])
    v2 = west.store.put("ckpt", "m", [rewrite(old, 0.3)])
    relay = await Relay(west.address, damage_at_byte=100_000).start()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await fetch(central.address, "ckpt", "m", v2, [("eu-west", relay.address)])
    finally:
        await relay.stop()

    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    head = central.store.head("ckpt", "m")
    assert head is None or head.hlc != v2.hlc
    assert not list((central.root / "transfers").iterdir())  # damaged bytes are not resumed
    assert transfers(central.store)[-1]["outcome"] == "failed"


async def replicate(
    address: str,
    dataset: str,
    key: str,
    version: Version,
    data: bytes | None,
    epoch: int,
) -> agent_pb2.ReplicateResponse:
    header = agent_pb2.ReplicateHeader(
        dataset=dataset,
        key=key,
        version=version_to_wire(version),
        epoch=epoch,
        origin_region=version.hlc.region,
    )
    chunks = (
        [] if data is None else [data[at : at + (1 << 20)] for at in range(0, len(data), 1 << 20)]
    )
    # A refusal at the header may reach a raw stub as INTERNAL (grpc/grpc#36066).
    return await replicate_raw(address, header, chunks, timeout_s=30, options=CHANNEL_OPTIONS)


def put_version(hlc_ms: int, data: bytes) -> Version:
    return Version.put(HLC(hlc_ms, 0, "eu-west"), len(data), Digest.of(data))


MEMBERS = ("pushed", "fetched")


async def test_a_set_member_is_stored_only_after_the_roster_is_told(
    agents: AgentFactory,
) -> None:
    """A member of a version set stays on the agent that took it: before a pushed or
    fetched one is stored, the daemon's roster entry is lowered (`holding_sets`)."""
    west = await agents("eu-west")
    central = await agents("eu-central")
    told: list[tuple[bool, ...]] = []

    async def holding_sets() -> None:
        # What is stored when it is told: the member it is told for, not yet
        told.append(tuple(central.store.head("ckpt", k) is not None for k in MEMBERS))

    central.service.holding_sets = holding_sets
    plain = put_version(1_764_579_123_000, b"plain")
    await replicate(central.address, "ckpt", "plain", plain, b"plain", epoch=0)
    assert told == []  # not a set's
    member = put_version(1_764_579_124_000, b"member")
    header = agent_pb2.ReplicateHeader(
        dataset="ckpt", key="pushed", version=version_to_wire(member), set="s1"
    )
    header.origin_region = "eu-west"
    await replicate_raw(central.address, header, [b"member"], timeout_s=30)
    assert told == [(False, False)] and central.store.stat("ckpt", "pushed").set_id == "s1"
    fetched = west.store.put("ckpt", "fetched", [b"fetched"], set_id="s1")
    async with grpc.aio.insecure_channel(central.address, options=CHANNEL_OPTIONS) as channel:
        request = agent_pb2.FetchRequest(
            dataset="ckpt",
            key="fetched",
            version=version_to_wire(fetched),
            sources=[agent_pb2.FetchSource(region="eu-west", address=west.address)],
            origin_region="eu-west",
            set="s1",
        )
        await agent_pb2_grpc.AgentStub(channel).Fetch(request, timeout=30)
    assert told == [(False, False), (True, False)]
    assert central.store.stat("ckpt", "fetched").set_id == "s1"


async def test_replicate_refuses_a_stale_epoch(agents: AgentFactory) -> None:
    central = await agents("eu-central")
    first = put_version(1_764_579_123_456, b"epoch five")
    late = put_version(1_764_579_123_999, b"epoch four")
    # A replica also checks etcd's owner record before acking (issue 13): eu-west at 5.
    central.owners.set("crit", "eu-west", 5)

    done = await replicate(central.address, "crit", "k", first, b"epoch five", epoch=5)
    assert done.region == "eu-central"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replicate(central.address, "crit", "k", late, b"epoch four", epoch=4)

    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert central.store.read_bytes("crit", "k") == b"epoch five"
    assert transfers(central.store)[-1]["outcome"] == "refused"
    assert central.metrics.stale_epoch_refused.labels(dataset="crit")._value.get() == 1


async def test_replicate_standard_with_epoch_zero_applies_by_lww(agents: AgentFactory) -> None:
    central = await agents("eu-central")
    newer = put_version(1_764_579_124_000, b"newer")
    older = put_version(1_764_579_123_000, b"older")

    await replicate(central.address, "ckpt", "k", newer, b"newer", epoch=0)
    got = await replicate(central.address, "ckpt", "k", older, b"older", epoch=0)

    assert got.version.hlc == newer.hlc.text  # the newest held: the older one lost
    assert central.store.read_bytes("ckpt", "k") == b"newer"
    tomb = Version.delete(HLC(1_764_579_125_000, 0, "eu-west"))
    await replicate(central.address, "ckpt", "k", tomb, None, epoch=0)
    with pytest.raises(NotFoundError):
        central.store.read_bytes("ckpt", "k")
    assert [r["outcome"] for r in transfers(central.store)] == ["completed", "skipped", "completed"]


async def test_replicate_is_fenced_again_at_its_commit(agents: AgentFactory) -> None:
    """A failover (a newer epoch seen by the fence) while a push streams refuses the push
    at its commit: the header's admission alone let a stale owner's copy in (review)."""
    central = await agents("eu-central")
    data = bytes(range(256)) * 8192  # 2 MiB: two chunks
    version = put_version(1_764_579_123_456, data)
    first_sent, failover_seen = asyncio.Event(), asyncio.Event()

    async def frames() -> object:
        yield agent_pb2.ReplicateRequest(
            header=agent_pb2.ReplicateHeader(
                dataset="crit",
                key="big",
                version=version_to_wire(version),
                epoch=5,
                origin_region="eu-west",
            )
        )
        yield agent_pb2.ReplicateRequest(chunk=data[: 1 << 20])
        first_sent.set()
        await failover_seen.wait()
        yield agent_pb2.ReplicateRequest(chunk=data[1 << 20 :])

    async with grpc.aio.insecure_channel(central.address, options=CHANNEL_OPTIONS) as channel:
        call = agent_pb2_grpc.AgentStub(channel).Replicate(frames(), timeout=30)
        await asyncio.wait_for(first_sent.wait(), 10)
        # The header was admitted once the first chunk is on the receiver's disk.
        await until(lambda: _staged_bytes(central.store.root) >= 1 << 20, 10, "1 MiB staged")
        central.fence.observe("crit", 6)  # the new owner's epoch, learnt mid-stream
        failover_seen.set()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(NotFoundError):
        central.store.read_bytes("crit", "big")
    assert transfers(central.store)[-1]["outcome"] == "refused"


def _staged_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "tmp").glob("*") if p.is_file())


async def test_a_residency_narrowed_during_a_pull_refuses_it_at_the_commit(
    agents: AgentFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`policy apply` narrowed the residency while the bytes were on their way: the
    receiver asks again before it commits, stores nothing, keeps no partial, and
    records the copy refused (agents stop accepting new copies at once)."""
    west = await agents("eu-west")
    central = await agents("eu-central")
    version = west.store.put("ckpt", "c", [b"x" * 100_000])
    asked = 0
    admit = central.admission.admit_store

    def narrowed_meanwhile(dataset: str) -> object:
        nonlocal asked
        asked += 1
        if asked > 1:  # the start was admitted; by the commit the residency narrowed
            raise ResidencyError(f"dataset {dataset} may no longer be held in eu-central")
        return admit(dataset)

    monkeypatch.setattr(central.admission, "admit_store", narrowed_meanwhile)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch(central.address, "ckpt", "c", version, [("eu-west", west.address)])

    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert asked == 2
    assert central.store.head("ckpt", "c") is None
    assert central.service.book.load("ckpt", "c", version.hlc.text) is None
    assert not central.service.book.partial_path("ckpt", "c", version.hlc.text).exists()
    assert [r["outcome"] for r in transfers(central.store)] == ["refused"]
    counted = central.metrics.transfers.labels(direction="in", outcome="refused")
    assert counted._value.get() == 1


async def test_an_undecidable_admission_at_the_commit_asks_no_other_source(
    agents: AgentFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No policy can be read by the time the bytes arrived: this region's own answer,
    which no other source changes; the next source is not asked to send it all again."""
    west = await agents("eu-west")
    north = await agents("eu-north")
    central = await agents("eu-central")
    version = west.store.put("ckpt", "d", [b"y" * 100_000])
    north.store.apply("ckpt", "d", version, [b"y" * 100_000])
    asked = 0
    admit = central.admission.admit_store

    def policy_gone_meanwhile(dataset: str) -> object:
        nonlocal asked
        asked += 1
        if asked > 1:
            raise NotGovernedError(f"dataset {dataset} cannot be admitted: no policy")
        return admit(dataset)

    monkeypatch.setattr(central.admission, "admit_store", policy_gone_meanwhile)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch(
            central.address,
            "ckpt",
            "d",
            version,
            [("eu-west", west.address), ("eu-north", north.address)],
        )

    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert asked == 2  # the start, then one commit: one source sent it
    assert central.store.head("ckpt", "d") is None
    assert [r["outcome"] for r in transfers(central.store)] == ["refused"]
