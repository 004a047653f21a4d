"""A new owner's takeover pass reconciles what a deposed owner kept alone.

The deposed owner (eu-west) commits a write that no replica takes (both are down),
then is paused while eu-central takes the dataset over at a newer epoch and writes.
Once eu-west wakes up, the copies must converge (chaos scenarios 2-4 found them
differing for ever):

* the lone write is older than the new epoch's first write: the new owner adopts
  it (it may have been an acked write the new owner missed) and spreads it;
* it is newer (eu-central's clock runs behind, as a real one may): it can only be a
  write the old owner made after the new epoch began, never acked, and it must not
  supersede anything acked now: the new owner has eu-west rewind it.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator

import grpc
import pytest
from critical_helpers import put, stat
from harness.agent_process import AgentProcess
from waiting import WaitTimeoutError, until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

pytestmark = pytest.mark.integration

Agents = dict[str, AgentProcess]
DATASET = "tri/takeover"


async def _lone_write_then_takeover(
    agents: Agents, coord: EtcdCoordination, central_offset_ms: int, *, delete: bool = False
) -> tuple[agent_pb2.ObjectInfo, agent_pb2.PutResponse, agent_pb2.PutResponse]:
    """eu-west's lone unacked write (returned as eu-west holds it: `lone`, or with
    `delete` a delete of `base`), eu-central's first write at the new epoch, and the
    write of `base` all three acked; eu-west is running again on return."""
    west, central, north = (agents[r] for r in ("eu-west", "eu-central", "eu-north"))
    epoch1 = await Ownership(coord).claim(
        DATASET, "eu-west", expect_epoch=0, reason="home", actor="test"
    )
    assert epoch1 is not None
    base = await put(west.address, DATASET, "base", b"acked by all")
    for proc in (central, north):  # a quorum of 2 of 3: the third copy may be on its way
        assert await _wait_held(proc.address, "base", base.version.digest) is not None
    assert central.stop() == 0 and north.stop() == 0
    with pytest.raises(grpc.aio.AioRpcError) as unacked:
        if delete:
            await _delete(west.address, "base")
        else:
            await put(west.address, DATASET, "lone", b"only the old owner has this")
    assert unacked.value.code() == grpc.StatusCode.UNAVAILABLE
    lone = await _newest(west.address, "base" if delete else "lone")
    assert lone is not None  # committed there, not acked
    assert lone.version.op == (types_pb2.OP_DELETE if delete else types_pb2.OP_PUT)

    west.signal(signal.SIGSTOP)  # its catch-up must not push `lone` before the move
    try:
        if central_offset_ms:
            central.env = {**central.env, "MERIDIAN_CLOCK_OFFSET_MS": str(central_offset_ms)}
        central.start()
        north.start()
        epoch2 = await Ownership(coord).claim(
            DATASET, "eu-central", expect_epoch=epoch1, reason="failover", actor="test"
        )
        assert epoch2 is not None and epoch2 > epoch1
        first = await put(central.address, DATASET, "new", b"the new owner's first write")
        assert sorted(first.regions) == ["eu-central", "eu-north"]
    finally:
        west.signal(signal.SIGCONT)
    return lone, first, base


async def _delete(address: str, key: str) -> agent_pb2.DeleteResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        return await stub.Delete(agent_pb2.DeleteRequest(dataset=DATASET, key=key), timeout=30)


async def _newest(address: str, key: str) -> agent_pb2.ObjectInfo | None:
    """The newest version `address` holds of DATASET/key, a delete included."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        request = agent_pb2.ListRequest(dataset=DATASET, prefix=key, include_deleted=True)
        page = await stub.List(request, timeout=10)
    return next((o for o in page.objects if o.key == key), None)


async def _acked_without(
    agents: Agents, coord: EtcdCoordination, down: str, key: str, then_owner: str
) -> tuple[agent_pb2.PutResponse, int]:
    """eu-west owns DATASET (epoch 1) and writes `key` acked without `down` (stopped);
    then `then_owner` owns it at a newer epoch. Returns the acked write and that epoch."""
    own = Ownership(coord)
    epoch1 = await own.claim(DATASET, "eu-west", expect_epoch=0, reason="home", actor="test")
    assert epoch1 is not None
    assert agents[down].stop() == 0
    acked = await put(agents["eu-west"].address, DATASET, key, f"acked without {down}".encode())
    others = sorted({"eu-west", "eu-central", "eu-north"} - {down})
    assert sorted(acked.regions) == others
    epoch2 = await own.claim(
        DATASET, then_owner, expect_epoch=epoch1, reason="failover", actor="test"
    )
    assert epoch2 is not None and epoch2 > epoch1
    return acked, epoch2


async def _wait_held(
    address: str, key: str, want: str | None, timeout_s: float = 45
) -> agent_pb2.ObjectInfo | None:
    """What `address` holds of DATASET/key once its digest is `want` (None: nothing);
    the last answer if it never is (the callers' asserts then say what is wrong)."""

    async def settled() -> tuple[agent_pb2.ObjectInfo | None] | None:
        found = await stat(address, DATASET, key)
        return (found,) if (found.version.digest if found else None) == want else None

    try:
        (found,) = await until(settled, timeout_s, f"{key} at {want} in {address}", step_s=0.1)
    except WaitTimeoutError:
        return await stat(address, DATASET, key)
    return found


async def test_a_lone_write_older_than_the_new_epoch_is_adopted_everywhere(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    lone, first, _ = await _lone_write_then_takeover(eu_agents, coord, central_offset_ms=0)
    assert lone.version.hlc < first.version.hlc
    for region in ("eu-central", "eu-north"):
        held = await _wait_held(eu_agents[region].address, "lone", lone.version.digest)
        assert held is not None, f"{region} never got the old owner's lone write"
        assert (held.version.hlc, held.version.digest) == (lone.version.hlc, lone.version.digest)
    west = await stat(eu_agents["eu-west"].address, DATASET, "lone")
    assert west is not None and west.version.hlc == lone.version.hlc
    # And the deposed owner got the new owner's write (its catch-up at the new epoch).
    new = await _wait_held(eu_agents["eu-west"].address, "new", first.version.digest)
    assert new is not None and new.version.hlc == first.version.hlc


async def test_a_lone_write_newer_than_the_new_epoch_is_rewound(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    lone, first, _ = await _lone_write_then_takeover(eu_agents, coord, central_offset_ms=-60_000)
    assert lone.version.hlc > first.version.hlc  # the new owner's clock is behind
    gone = await _wait_held(eu_agents["eu-west"].address, "lone", None)
    assert gone is None, f"eu-west still holds the unacked {gone}"
    for region in ("eu-central", "eu-north"):
        assert await stat(eu_agents[region].address, DATASET, "lone") is None
    base = await stat(eu_agents["eu-west"].address, DATASET, "base")
    assert base is not None  # only the unacked version went


async def test_a_lone_delete_newer_than_the_new_epoch_is_rewound(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """The deposed owner's unacked delete, made after the new epoch began, must not hide
    the acked object in its region: the pass proves it lone (no other region's listing,
    which shows tombstones, holds it) and has eu-west rewind it, which shows `base`
    there again. (An acked delete held by two regions is kept: the test below.)"""
    lone, first, base = await _lone_write_then_takeover(
        eu_agents, coord, central_offset_ms=-60_000, delete=True
    )
    assert lone.version.hlc > first.version.hlc  # the new owner's clock is behind
    for region in ("eu-west", "eu-central", "eu-north"):
        shown = await _wait_newest(eu_agents[region].address, "base", base.version.hlc)
        assert shown is not None and shown.version.hlc == base.version.hlc, (
            f"{region} shows {shown} of base, not the acked put"
        )
        assert shown.version.digest == base.version.digest


async def test_rewind_is_fenced_like_a_push(eu_agents: Agents, coord: EtcdCoordination) -> None:
    """Only the owner at the current epoch (per etcd) has a replica drop a version."""
    west, north = eu_agents["eu-west"], eu_agents["eu-north"]
    epoch = await Ownership(coord).claim(
        DATASET, "eu-west", expect_epoch=0, reason="home", actor="test"
    )
    assert epoch is not None
    acked = await put(west.address, DATASET, "k", b"acked")
    # Acked by a quorum of 2 of 3: eu-north's copy may still be on its way.
    held = await _wait_held(north.address, "k", acked.version.digest)
    assert held is not None

    async def rewind(
        epoch: int, origin: str, version: agent_pb2.Version
    ) -> agent_pb2.RewindResponse:
        async with grpc.aio.insecure_channel(north.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            request = agent_pb2.RewindRequest(
                dataset=DATASET, key="k", version=version, epoch=epoch, origin_region=origin
            )
            return await stub.Rewind(request, timeout=10)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rewind(epoch, "eu-central", held.version)  # not the owner
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    still = await stat(north.address, DATASET, "k")
    assert still is not None and still.version.hlc == acked.version.hlc
    done = await rewind(epoch, "eu-west", held.version)
    assert done.dropped and not done.HasField("newest")
    assert await stat(north.address, DATASET, "k") is None

    again = await put(west.address, DATASET, "k", b"acked again")
    assert await _wait_held(north.address, "k", again.version.digest) is not None
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await rewind(epoch + 1, "eu-west", again.version)  # an epoch etcd never gave
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    kept = await stat(north.address, DATASET, "k")
    assert kept is not None and kept.version.hlc == again.version.hlc


async def test_a_catch_up_begun_at_an_older_epoch_goes_on_at_the_new_one(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """eu-north misses writes at epoch 1 (down), then eu-west takes the dataset again at
    epoch 2 and writes: once eu-north is back, the catch-up begun at epoch 1 is fenced
    there, and must go on at epoch 2 rather than give up on a replica that lacks the
    new epoch's first write (no takeover pass pushes that one: chaos scenario 10)."""
    west, north = eu_agents["eu-west"], eu_agents["eu-north"]
    missed, epoch2 = await _acked_without(
        eu_agents, coord, "eu-north", "missed", then_owner="eu-west"
    )
    # At the epoch the client read, as the CLI writes: the agent's own view of the
    # owner may be up to half a second old (CI once wrote at epoch 1 here).
    first = await put(west.address, DATASET, "first", b"the epoch two write", epoch=epoch2)
    assert sorted(first.regions) == ["eu-central", "eu-west"]
    north.start()
    for key, acked in (("missed", missed), ("first", first)):
        held = await _wait_held(north.address, key, acked.version.digest)
        assert held is not None, f"eu-north never got {key}"
        assert held.version.hlc == acked.version.hlc


async def test_a_new_owner_levels_the_replicas_before_it_writes(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """eu-north misses an acked write (down); eu-central takes the dataset over and
    writes nothing. The deposed owner's catch-up is fenced there, so only the new
    owner's takeover pass, begun when its watch names it, can bring eu-north level."""
    north = eu_agents["eu-north"]
    missed, _ = await _acked_without(
        eu_agents, coord, "eu-north", "missed", then_owner="eu-central"
    )
    north.start()
    held = await _wait_held(north.address, "missed", missed.version.digest)
    assert held is not None, "eu-north never got the write it missed"
    assert held.version.hlc == missed.version.hlc


async def test_what_was_acked_is_kept_when_the_new_owners_clock_is_behind(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    """An acked write, an acked delete and an acked version set that the new owner
    missed (down) look "newer than the epoch" to a clock that runs behind; held by two
    regions, each was (or may have been) acked: each must be adopted, never rewound.
    The reviews found both: a write rewound (the first pass), and a delete "proven"
    lone because `Stat` hides tombstones, rewound in both regions that held it. A set
    whose members alone were adopted left the new owner showing no set at all."""
    west, central, north = (eu_agents[r] for r in ("eu-west", "eu-central", "eu-north"))
    own = Ownership(coord)
    epoch1 = await own.claim(DATASET, "eu-west", expect_epoch=0, reason="home", actor="test")
    assert epoch1 is not None
    doomed = await put(west.address, DATASET, "doomed", b"deleted while eu-central is down")
    assert await _wait_held(central.address, "doomed", doomed.version.digest) is not None
    assert central.stop() == 0
    acked = await put(west.address, DATASET, "acked", b"acked without eu-central")
    deleted = await _delete(west.address, "doomed")
    shards = [await _put_shard(west.address, n) for n in range(2)]
    ckpt = await _commit_set(west.address, shards)
    for what in (acked, deleted, ckpt):
        assert sorted(what.regions) == ["eu-north", "eu-west"]
    epoch2 = await own.claim(
        DATASET, "eu-central", expect_epoch=epoch1, reason="failover", actor="test"
    )
    assert epoch2 is not None and epoch2 > epoch1
    # Its clock a minute behind (tolerated, so that it can adopt what it finds); its
    # takeover pass begins at its start.
    central.env = {
        **central.env,
        "MERIDIAN_CLOCK_OFFSET_MS": "-60000",
        "MERIDIAN_MAX_CLOCK_SKEW_MS": "120000",
    }
    central.start()
    # Both first passes judged everything (a rewind would have been made by then), and
    # none rewound anything: all of it was held by two regions.
    await until(
        lambda: {"eu-west", "eu-north"} <= _passes_done(central),
        90,
        "eu-central's takeover passes over eu-west and eu-north",
        step_s=0.2,
    )
    assert '"takeover_rewound"' not in central.log_text(), "an acked version was rewound"
    for proc in (west, north, central):  # kept where it was, and adopted
        held = await _wait_held(proc.address, "acked", acked.version.digest)
        assert held is not None, f"{proc.region} lost the acked write"
        assert held.version.hlc == acked.version.hlc
        gone = await _wait_newest(proc.address, "doomed", deleted.version.hlc)
        assert gone is not None and gone.version.hlc == deleted.version.hlc, (
            f"{proc.region} shows {gone} of the deleted object, not the acked delete"
        )
    shown = await _wait_set(central.address, ckpt.set.hlc)
    assert shown is not None, "eu-central never showed the acked set"
    assert (shown.id, shown.hlc) == (ckpt.set.id, ckpt.set.hlc)
    assert sorted((m.key, m.version) for m in shown.members) == sorted(
        (m.key, m.version) for m in ckpt.set.members
    )


def _passes_done(proc: AgentProcess) -> set[str]:
    """The regions `proc`'s takeover passes are done with, from its log."""
    done: set[str] = set()
    for line in proc.log_text().splitlines():
        if '"takeover_pass_done"' in line:
            with contextlib.suppress(ValueError):
                done.add(str(json.loads(line).get("region")))
    return done


async def _put_shard(address: str, n: int) -> agent_pb2.PutResponse:
    async def frames() -> AsyncIterator[agent_pb2.PutRequest]:
        header = agent_pb2.PutHeader(dataset=DATASET, key=f"shard-{n}", set="ckpt")
        yield agent_pb2.PutRequest(header=header)
        yield agent_pb2.PutRequest(chunk=f"shard {n} of ckpt".encode())
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    async with grpc.aio.insecure_channel(address) as channel:
        return await agent_pb2_grpc.AgentStub(channel).Put(frames(), timeout=30)  # type: ignore[arg-type]


async def _commit_set(
    address: str, shards: list[agent_pb2.PutResponse]
) -> agent_pb2.CommitSetResponse:
    members = [
        types_pb2.SetMember(key=f"shard-{n}", version=s.version.hlc) for n, s in enumerate(shards)
    ]
    request = agent_pb2.CommitSetRequest(
        set=types_pb2.VersionSet(dataset=DATASET, id="ckpt", members=members)
    )
    async with grpc.aio.insecure_channel(address) as channel:
        return await agent_pb2_grpc.AgentStub(channel).CommitSet(request, timeout=30)


async def _wait_newest(
    address: str, key: str, hlc: str, timeout_s: float = 45
) -> agent_pb2.ObjectInfo | None:
    """What `address` holds of DATASET/key, a delete included, once its newest is at
    `hlc`; the last answer if it never is."""

    async def settled() -> tuple[agent_pb2.ObjectInfo | None] | None:
        found = await _newest(address, key)
        return (found,) if found is not None and found.version.hlc == hlc else None

    try:
        (found,) = await until(settled, timeout_s, f"{key} at {hlc} in {address}", step_s=0.1)
    except WaitTimeoutError:
        return await _newest(address, key)
    return found


async def _wait_set(address: str, hlc: str, timeout_s: float = 45) -> types_pb2.VersionSet | None:
    """The newest set `address` shows once it is the one at `hlc`; the last one shown
    (None: none) if it never is."""

    async def shown() -> types_pb2.VersionSet | None:
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                got = await agent_pb2_grpc.AgentStub(channel).GetSet(
                    agent_pb2.GetSetRequest(dataset=DATASET, set="latest"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
        return got.set

    async def settled() -> types_pb2.VersionSet | None:
        got = await shown()
        return got if got is not None and got.hlc == hlc else None

    try:
        return await until(settled, timeout_s, f"the set at {hlc} in {address}", step_s=0.1)
    except WaitTimeoutError:
        return await shown()
