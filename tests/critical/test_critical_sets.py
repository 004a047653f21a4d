"""Version sets of critical datasets against real agent processes and etcd (issue 13):
a set's ack covers every member and the set record in the regions it names, and a
reader in a replica region polling the newest set while checkpoints of 16 shards
are written only ever sees complete sets, each member bit-exact at the set's version,
never a mix of two sets.

The owner reaches eu-north through a Toxiproxy proxy with latency and a bandwidth
cap, so eu-north is the straggler of every member's quorum (eu-central acks first):
the set record regularly reaches it before the last of its members, which is the
window in which a region must not show the set yet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import waiting
from critical_helpers import prepare_critical_world
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess
from harness.controllers import meridian_argv
from harness.ports import free_port

from agents.client import AgentClient
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.coordination.protocols.ownership import Ownership
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

pytestmark = pytest.mark.integration

SHARDS = 16
SHARD_BYTES = 96 * 1024
SETS = 8
DATASET = "tri/ckpt"


def shard(set_no: int, n: int) -> bytes:
    """The content of shard `n` of set `set_no`: names both, then a filler of its own."""
    head = f"set=ckpt-{set_no} shard={n:02d}\n".encode()
    seed = hashlib.sha256(head).digest()
    body = (seed * (SHARD_BYTES // len(seed) + 1))[: SHARD_BYTES - len(head)]
    return head + body


def owner_of(data: bytes) -> tuple[str, int]:
    """The set id and shard number a content names."""
    first = data.split(b"\n", 1)[0].decode()
    set_part, shard_part = first.split(" ")
    return set_part.removeprefix("set="), int(shard_part.removeprefix("shard="))


@pytest.fixture
def slow_north_world(
    tmp_path: Path, etcd_endpoint: str, toxiproxy_url: str
) -> Iterator[dict[str, AgentProcess]]:
    """eu-west (owner), eu-central and eu-north agents; the owner's pushes to eu-north
    go through a proxy adding 50 ms each way and capping 2 MiB/s."""
    clear_keyspace(etcd_endpoint)
    env = prepare_critical_world(tmp_path / "world", etcd_endpoint)
    procs = {
        r: AgentProcess(r, tmp_path / r, dict(env), tmp_path / f"{r}.log")
        for r in ("eu-west", "eu-central", "eu-north")
    }
    toxi = ToxiproxyClient(toxiproxy_url, timeout_s=5)
    name = f"crit-sets-{tmp_path.name}"[:60]
    created = False
    try:
        procs["eu-central"].start()
        procs["eu-north"].start()
        port = free_port()
        toxi.create_proxy(name, f"127.0.0.1:{port}", procs["eu-north"].address)
        created = True
        toxi.add_latency(name, 50)
        toxi.add_bandwidth(name, 2 * 1024)
        procs["eu-west"].env["MERIDIAN_AGENT_ROUTES"] = f"eu-north=127.0.0.1:{port}"
        procs["eu-west"].start()
        yield procs
    finally:
        if created:
            toxi.delete_proxy(name)
        for proc in procs.values():
            if proc.running:
                proc.stop()


async def claim(etcd: str, dataset: str) -> int:
    coord = EtcdCoordination([etcd], timeout_s=5.0)
    await coord.connect()
    try:
        epoch = await Ownership(coord).claim(
            dataset, "eu-west", expect_epoch=0, reason="home", actor="test"
        )
    finally:
        await coord.close()
    assert epoch is not None
    return epoch


async def read(stub: agent_pb2_grpc.AgentStub, key: str, version: str) -> bytes | None:
    """One member at one version (None when this agent does not hold it)."""
    parts: list[bytes] = []
    try:
        call = stub.Get(agent_pb2.GetRequest(dataset=DATASET, key=key, version=version), timeout=10)
        async for msg in call:
            if msg.WhichOneof("frame") == "chunk":
                parts.append(msg.chunk)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    return b"".join(parts)


async def get_set(stub: agent_pb2_grpc.AgentStub, set_id: str) -> types_pb2.VersionSet | None:
    try:
        got = await stub.GetSet(agent_pb2.GetSetRequest(dataset=DATASET, set=set_id), timeout=10)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    return got.set


class Reader:
    """Polls the newest set of one region and reads every member at the set's version
    until told to stop (bounded in count and time)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.seen: list[str] = []  # the set ids read whole, in order
        self.violations: list[str] = []
        self.superseded = 0  # a member went with a newer set before it was read
        self.stop = asyncio.Event()

    async def run(self, timeout_s: float = 120) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for _ in range(20_000):
                if self.stop.is_set() or loop.time() >= until:
                    return
                await self._once(stub, until - loop.time())

    async def _once(self, stub: agent_pb2_grpc.AgentStub, left_s: float) -> None:
        try:  # at once, but for the first set, which may come later
            shown = await waiting.until(
                lambda: get_set(stub, "latest"), max(0.0, left_s), what="a set", step_s=0.01
            )
        except waiting.WaitTimeoutError:
            return
        if len(shown.members) != SHARDS:
            self.violations.append(f"{shown.id} shows {len(shown.members)} members")
            return
        # Every member at once (the set's window is short): all present, or superseded.
        got = await asyncio.gather(*(read(stub, m.key, m.version) for m in shown.members))
        lacking = [m for m, data in zip(shown.members, got, strict=True) if data is None]
        if lacking:
            again = await get_set(stub, "latest")
            if again is not None and (again.id, again.hlc) == (shown.id, shown.hlc):
                names = ", ".join(f"{m.key}@{m.version}" for m in lacking)
                self.violations.append(f"{shown.id} is shown but lacks {names}")
            else:
                self.superseded += 1  # a newer set came and its keys' old versions went
            return
        for member, data in zip(shown.members, got, strict=True):
            assert data is not None  # checked just above
            set_id, n = owner_of(data)
            want = f"shard-{n:02d}"
            if set_id != shown.id or member.key != want:
                self.violations.append(
                    f"{shown.id}: member {member.key} holds {set_id}'s {want} (a mix)"
                )
                return
            if data != shard(int(set_id.removeprefix("ckpt-")), n):
                self.violations.append(f"{shown.id}: member {member.key} is not bit-exact")
                return
        if not self.seen or self.seen[-1] != shown.id:
            self.seen.append(shown.id)


async def test_a_reader_in_a_replica_region_only_ever_sees_whole_sets(
    slow_north_world: dict[str, AgentProcess], etcd_endpoint: str
) -> None:
    west, central, north = (slow_north_world[r] for r in ("eu-west", "eu-central", "eu-north"))
    await claim(etcd_endpoint, DATASET)
    reader = Reader(north.address)
    reading = asyncio.create_task(reader.run())
    acked: list[tuple[str, list[str]]] = []
    try:
        async with (
            AgentClient(west.address) as client,
            grpc.aio.insecure_channel(west.address) as channel,
        ):
            owner = agent_pb2_grpc.AgentStub(channel)
            for set_no in range(SETS):
                set_id = f"ckpt-{set_no}"
                members: dict[str, str] = {}
                for n in range(SHARDS):
                    data = shard(set_no, n)

                    async def chunks(data: bytes = data) -> object:
                        yield data

                    version = await client.put(
                        DATASET,
                        f"shard-{n:02d}",
                        chunks(),  # type: ignore[arg-type]
                        set_id=set_id,
                        size=len(data),
                    )
                    members[f"shard-{n:02d}"] = version.hlc.text
                done = await owner.CommitSet(
                    agent_pb2.CommitSetRequest(
                        set=types_pb2.VersionSet(
                            dataset=DATASET,
                            id=set_id,
                            members=[
                                types_pb2.SetMember(key=k, version=v) for k, v in members.items()
                            ],
                        )
                    ),
                    timeout=60,
                )
                regions = list(done.regions)
                assert regions[0] == "eu-west" and len(regions) >= 2, regions
                acked.append((set_id, regions))
                # Acked means shown there, at once: every member and the set record.
                for region in regions:
                    address = slow_north_world[region].address
                    async with grpc.aio.insecure_channel(address) as ch:
                        there = await get_set(agent_pb2_grpc.AgentStub(ch), set_id)
                    assert there is not None, f"{set_id} acked by {region}, unknown there"
                    assert {m.key: m.version for m in there.members} == members
    finally:
        # The reader goes on until eu-north shows the last set (or its bound ends).
        last = f"ckpt-{SETS - 1}"
        # Not raised: the assertions below say what the reader saw, and in a `finally`
        # a timeout would hide the error that brought the test here.
        with contextlib.suppress(waiting.WaitTimeoutError):
            await waiting.until(
                lambda: reader.seen[-1:] == [last] or reading.done(), 30, what=f"{last} read"
            )
        reader.stop.set()
        await reading

    assert reader.violations == []
    # Not vacuous: the reader saw several sets whole, the last one included, in order.
    assert len(reader.seen) >= 2, reader.seen
    assert reader.seen[-1] == last
    numbers = [int(s.removeprefix("ckpt-")) for s in reader.seen]
    assert numbers == sorted(numbers)
    # eu-central holds every set whole too (it was the quorum's partner).
    async with grpc.aio.insecure_channel(central.address) as ch:
        latest = await get_set(agent_pb2_grpc.AgentStub(ch), "latest")
    assert latest is not None and latest.id == last


async def test_object_put_set_of_files_on_a_critical_dataset_is_acked_whole(
    slow_north_world: dict[str, AgentProcess], etcd_endpoint: str, tmp_path: Path
) -> None:
    west, north = slow_north_world["eu-west"], slow_north_world["eu-north"]
    dataset = "every/cli"  # ack: all, so eu-north too must show the set before the ack
    await claim(etcd_endpoint, dataset)
    files = []
    for n in range(4):
        path = tmp_path / f"part-{n}.bin"
        path.write_bytes(shard(100 + n, n))
        files.append(path.name)
    argv = [*meridian_argv(), "object", "put", "--dataset", dataset, "--set", "step-1"]
    done = await asyncio.to_thread(
        subprocess.run,  # from the files' folder: the keys are the paths given
        [*argv, *files, "-o", "json"],
        env={**os.environ, **west.env, "MERIDIAN_AGENT": west.address},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert sorted(r["key"] for r in rows) == sorted(files)
    assert len({r["set"] for r in rows}) == 1
    # No waiting: the ack of ack-all means eu-north shows it now, each member exact.
    async with AgentClient(north.address) as client:
        shown = await client.get_set(dataset, "latest")
        assert shown.id == "step-1"
        for member in shown.members:
            out = tmp_path / "got" / member.key
            out.parent.mkdir(exist_ok=True)
            await client.get(dataset, member.key, out, version=member.version)
            assert out.read_bytes() == (tmp_path / member.key).read_bytes()
