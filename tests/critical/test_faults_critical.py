"""Fault tests of critical datasets, on real agent and controller processes, real etcd
and a Toxiproxy proxy in front of every region's agent (faults_world), one world
for the module (each test its own datasets; the processes it kills it restarts):

* a writer hammers a dataset with acked writes while a switchover runs and while
  the owner region is SIGKILLed and failed over automatically: afterwards every
  acked write is readable, bit-exact, from the new owner; the owners and epochs
  journaled follow one another without overlap; the failover journals the RPO
  exposure the agents told (zero: `ack: quorum` with a majority alive);
* a replica partitioned during writes: `ack: quorum` writes go on, `ack: all`
  ones are refused as retriable naming it, the catalog shows what it lacks; after
  the heal it catches up and the catalog says so;
* the owner region paused past its lease, failed over, resumed: no write it then
  attempts is accepted by any replica, and each replica counts its refusals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from urllib.request import urlopen

import grpc
import pytest
from faults_world import (
    EU,
    Acked,
    FaultsWorld,
    Writer,
    bounded,
    listing,
    metric,
    raw_gets,
    raw_put,
    wait_alive,
    wait_owner,
)
from harness.agent_fixtures import clear_keyspace
from harness.cli_schema import check_output
from harness.raw_replicate import replicate_raw
from waiting import WaitTimeoutError, until, until_sync

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.holdings import read_holdings
from meridian.v1 import agent_pb2, types_pb2

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def world(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, toxiproxy_url: str
) -> AsyncIterator[FaultsWorld]:
    clear_keyspace(etcd_endpoint)
    w = FaultsWorld(tmp_path_factory.mktemp("faults") / "world", etcd_endpoint, toxiproxy_url)
    try:
        await w.start(["auto/a", "auto/b", "auto/c", "auto/d", "strict/c"])
        yield w
    finally:
        await w.stop()


@pytest.fixture
async def coord(etcd_endpoint: str, world: FaultsWorld) -> AsyncIterator[EtcdCoordination]:
    async with EtcdCoordination([etcd_endpoint], timeout_s=5.0) as c:
        yield c


async def assert_readable_from(
    world: FaultsWorld, region: str, dataset: str, acked: list[Acked]
) -> None:
    address = world.agents[region].address
    held = await listing(address, dataset)
    lost = [a.key for a in acked if held.get(a.key) != a.digest]
    assert not lost, f"{len(lost)} acked write(s) not held by {region}: {lost[:5]}"
    got = await raw_gets(address, dataset, [a.key for a in acked])
    assert [a.key for a in acked if got[a.key] != a.data] == []  # bit-exact, not by digest


def history(world: FaultsWorld, dataset: str) -> list[dict[str, object]]:
    code, out, err = world.cli("history", "--output", "json")
    assert code == 0, err
    rows = json.loads(out)
    check_output("history", rows)
    return sorted((r for r in rows if r["dataset"] == dataset), key=lambda r: int(r["epoch"]))


def assert_no_overlap(rows: list[dict[str, object]], acked: list[Acked], first: str) -> None:
    """Epochs grow, each move starts where the last ended, and the acking owners of the
    writes (in the order they were acked) follow that chain: no write acked by an
    owner after the next one acked its first."""
    chain = [first]
    epochs = [int(r["epoch"]) for r in rows]
    assert epochs == sorted(set(epochs)), epochs
    for r in rows:
        assert r["from"] == chain[-1], (r, chain)
        chain.append(str(r["to"]))
    owners: list[str] = []
    for a in acked:
        if not owners or owners[-1] != a.region:
            owners.append(a.region)
    at = 0
    for o in owners:  # a subsequence of the chain, in order
        while at < len(chain) and chain[at] != o:
            at += 1
        assert at < len(chain), f"acking owners {owners} do not follow the moves {chain}"


def catalog_status(world: FaultsWorld, dataset: str, region: str) -> dict[str, object]:
    """`replication status` of one dataset and region, as the CLI computes it."""
    from datetime import UTC, datetime

    from controlplane.catalog.api import open_catalog
    from replicator.status import replication_status

    catalog = open_catalog(world.env["MERIDIAN_CATALOG"])
    try:
        (row,) = replication_status(
            catalog, datetime.now(UTC), dataset_glob=dataset, region=region, state="pending"
        )
    finally:
        catalog.close()
    return row


async def wait_status(
    world: FaultsWorld,
    dataset: str,
    region: str,
    pending: int,
    objects: set[str] | None = None,
    timeout_s: float = 30,
) -> dict[str, object]:
    """The catalog's row once it shows `pending` (and, if given, those very `objects`).

    The records ship in the background, each agent's on its own, so a count alone can
    match a moment that mixes an older pending object with a newer one not yet shown.
    """
    row: dict[str, object] = {}

    def names() -> set[str]:
        listed = row.get("objects")
        return {str(o["object"]) for o in listed} if isinstance(listed, list) else set()

    async def shown() -> dict[str, object] | None:
        nonlocal row
        row = await asyncio.to_thread(catalog_status, world, dataset, region)
        if row["pending"] != pending or (objects is not None and names() != objects):
            return None
        return row

    return await until(
        shown,
        timeout_s,
        what=f"{dataset} in {region} to show {pending} pending",
        step_s=0.1,
        detail=lambda: row,
    )


async def _holds(address: str, dataset: str, key: str, digest: str) -> bool:
    return (await listing(address, dataset)).get(key) == digest


async def test_a_partitioned_replica_quorum_goes_on_all_refuses_and_it_catches_up(
    world: FaultsWorld, coord: EtcdCoordination
) -> None:
    await wait_alive(coord, EU)  # every region's controller holds its lease: no failover
    owner = await wait_owner(coord, "auto/c", lambda o: o.handing_over_to is None)
    strict = await wait_owner(coord, "strict/c", lambda o: o.handing_over_to is None)
    assert owner.region == strict.region == "eu-west"
    west = world.agents["eu-west"].address
    cut = "eu-north"
    first = await raw_put(west, "auto/c", "before", b"before the partition")
    assert cut in first.regions or len(first.regions) >= 2
    # ack: quorum may answer before the push to eu-north lands: the partition must
    # not cut that push, or "before" is pending there too.
    north = world.agents[cut].address
    await until(
        lambda: _holds(north, "auto/c", "before", first.version.digest),
        30,
        what=f"{cut} to hold the write made before the partition",
        step_s=0.05,
    )
    await world.partition(cut, True)
    try:
        quorum: list[Acked] = []
        for i in range(8):  # ack: quorum: writes go on without it
            data = f"quorum {i}".encode() * 100
            resp = await raw_put(west, "auto/c", f"q{i}", data)
            assert cut not in resp.regions and len(resp.regions) == 2, resp.regions
            quorum.append(Acked(f"q{i}", data, resp.version.digest, "eu-west", tuple(resp.regions)))
        for i in range(3):  # ack: all: refused, retriable, naming the missing region
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw_put(west, "strict/c", f"s{i}", b"needs every copy")
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"{cut}:" in (refused.value.details() or ""), refused.value.details()
        # The catalog shows what the partitioned replica lacks, and why.
        row = await wait_status(
            world, "auto/c", cut, pending=len(quorum), objects={a.key for a in quorum}
        )
        objects = row["objects"]
        assert isinstance(objects, list)
        assert {o["object"] for o in objects} == {a.key for a in quorum}
        assert all("owner's catch-up" in str(o["why"]) for o in objects)
    finally:
        await world.partition(cut, False)

    # Healed: the owner's catch-up pushes what it missed; the catalog then says so.
    held: dict[str, str] = {}

    async def caught_up() -> bool:
        nonlocal held
        held = await listing(north, "auto/c")
        return all(held.get(a.key) == a.digest for a in quorum)

    with contextlib.suppress(WaitTimeoutError):  # the assertion says what it holds
        await until(caught_up, 30, what=f"{cut} to hold the quorum's writes", step_s=0.1)
    assert all(held.get(a.key) == a.digest for a in quorum), held
    await wait_status(world, "auto/c", cut, pending=0)
    code, out, err = await asyncio.to_thread(
        world.cli, "replication", "status", "--dataset", "auto/c", "--output", "json"
    )
    assert code == 0, err
    rows = json.loads(out)
    check_output("replication_status", rows)
    assert {r["region"]: r["pending"] for r in rows}[cut] == 0

    # And `ack: all` writes are acked again once it counts (bounded retries).
    async def acked() -> agent_pb2.PutResponse | None:
        try:
            return await raw_put(west, "strict/c", "after", b"every copy again")
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            return None

    resp = await until(acked, 60, what="an `ack: all` write acked again", step_s=0.1)
    assert sorted(resp.regions) == sorted(EU)


async def test_a_switchover_to_a_replica_that_is_behind_completes_once_it_caught_up(
    world: FaultsWorld, coord: EtcdCoordination
) -> None:
    """The target missed acked writes (partitioned) and is still behind when the
    handover freezes the dataset: every other replica refuses every push then, but the
    owner's catch-up still reaches the target, so the move completes holding every
    acked write. (Before, the target refused the catch-up too, and a switchover begun
    while it was behind, or while a push to it was in flight, always aborted.)"""
    ds = "auto/d"
    await wait_alive(coord, EU)
    before = await wait_owner(coord, ds, lambda o: o.handing_over_to is None)
    assert before.region == "eu-west"
    west = world.agents["eu-west"].address
    target = "eu-north"
    await world.partition(target, True)
    healed = False
    try:
        acked: list[Acked] = []
        for i in range(6):
            data = f"behind {i}".encode() * 64
            resp = await raw_put(west, ds, f"b{i}", data)
            assert target not in resp.regions, resp.regions
            acked.append(Acked(f"b{i}", data, resp.version.digest, "eu-west", tuple(resp.regions)))
        switch = asyncio.create_task(
            asyncio.to_thread(world.cli, "switchover", "--dataset", ds, "--to", target, "--yes")
        )
        # The freeze is on while the target still lacks all six: only then heal.
        await wait_owner(coord, ds, lambda o: o.handing_over_to == target, timeout_s=20)
        assert not switch.done()
        await world.partition(target, False)
        healed = True
        code, _out, err = await asyncio.wait_for(switch, 60)
        assert code == 0, err
    finally:
        if not healed:
            await world.partition(target, False)
    after = await wait_owner(coord, ds, lambda o: o.handing_over_to is None)
    assert (after.region, after.epoch > before.epoch) == (target, True)
    await assert_readable_from(world, target, ds, acked)


async def replicate(
    address: str, dataset: str, version: types_pb2.Version, data: bytes, epoch: int
) -> None:
    header = agent_pb2.ReplicateHeader(
        dataset=dataset, key="woken", version=version, epoch=epoch, origin_region="eu-west"
    )
    await replicate_raw(address, header, [data])  # grpc/grpc#36066: see raw_replicate


def scrape(world: FaultsWorld, region: str) -> str:
    with urlopen(f"http://{world.agents[region].metrics_address}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def test_a_woken_owner_region_gets_no_write_accepted_by_any_replica(
    world: FaultsWorld, coord: EtcdCoordination
) -> None:
    ds = "auto/b"
    before = await wait_owner(coord, ds, lambda o: o.region == "eu-west")
    west = world.agents["eu-west"]
    first = await raw_put(west.address, ds, "before", b"before the pause")
    assert len(first.regions) >= 2

    # The whole owner region pauses past its lease; the others fail it over.
    world.controllers["eu-west"].signal(signal.SIGSTOP)
    west.signal(signal.SIGSTOP)
    try:
        moved = await wait_owner(coord, ds, lambda o: o.epoch > before.epoch, timeout_s=30)
        assert moved.region in ("eu-central", "eu-north")
        after = await raw_put(world.agents[moved.region].address, ds, "after", b"new owner")
        assert len(after.regions) >= 2
    finally:
        west.signal(signal.SIGCONT)
        world.controllers["eu-west"].signal(signal.SIGCONT)

    replicas = [r for r in EU if r != "eu-west"]
    counted = {r: metric(scrape(world, r), "meridian_stale_epoch_refused_total") for r in replicas}
    # The woken owner's own writes: refused (it learns the new epoch from etcd).
    for attempt in range(5):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw_put(west.address, ds, "woken", f"woken {attempt}".encode())
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # What it would push at its old epoch: refused by every replica, each one counted.
    stale = types_pb2.Version(
        hlc=first.version.hlc, op=first.version.op, size=4, digest=first.version.digest
    )
    for _attempt in range(3):
        for r in replicas:
            with pytest.raises(grpc.aio.AioRpcError) as pushed:
                await replicate(world.agents[r].address, ds, stale, b"woke", before.epoch)
            assert pushed.value.code() == grpc.StatusCode.FAILED_PRECONDITION, r
    for r in replicas:
        assert metric(scrape(world, r), "meridian_stale_epoch_refused_total") >= counted[r] + 3, r
        held = await listing(world.agents[r].address, ds)
        assert "woken" not in held, r
    # The agents' records say who holds what; the old owner's agent, alive again,
    # republishes its own, which holds nothing acked after the move.
    records = await read_holdings(coord, ds)
    assert set(records) >= set(replicas)


def failover_row(world: FaultsWorld, dataset: str, epoch: int) -> dict[str, object]:
    """The journal row of the move to `epoch`, with its details, from the catalog."""
    from controlplane.catalog.api import open_catalog

    def row() -> dict[str, object] | None:
        for rec in catalog.list_failovers():
            if rec.dataset == dataset and rec.epoch == epoch:
                return {
                    "rpo_versions": rec.rpo_versions,
                    "details": json.loads(rec.details or "{}"),
                    "kind": rec.kind,
                }
        return None

    catalog = open_catalog(world.env["MERIDIAN_CATALOG"])
    try:  # the row may be written a moment after the move
        return until_sync(row, 10, what=f"a journal row for {dataset} at epoch {epoch}")
    finally:
        catalog.close()


async def test_acked_writes_survive_a_switchover_and_a_sigkilled_owner_region(
    world: FaultsWorld, coord: EtcdCoordination
) -> None:
    """Last in the module: it kills a region. The earlier tests moved `auto/a` away
    from eu-west (its owner region paused), so it starts wherever it is now."""
    ds = "auto/a"
    await wait_alive(coord, EU)  # eu-west's controller, resumed, is back
    start = await wait_owner(coord, ds, lambda o: o.handing_over_to is None)
    target = next(r for r in ("eu-west", "eu-central", "eu-north") if r != start.region)
    writer = Writer(world, coord, ds)
    load = asyncio.create_task(writer.run(max_writes=600, max_s=90))
    try:
        await writer.until(lambda: len(writer.acked) >= 8)
        # A planned switchover under load, through the CLI as an operator runs it.
        code, _out, err = await asyncio.to_thread(
            world.cli, "switchover", "--dataset", ds, "--to", target, "--yes"
        )
        assert code == 0, err
        await writer.until(lambda: sum(a.region == target for a in writer.acked) >= 8)

        # The owner region dies: agent and controller SIGKILLed, failed over automatically.
        killed_at = time.monotonic()
        at_kill = len(writer.acked)
        world.controllers[target].kill()
        world.agents[target].kill()
        moved = await wait_owner(coord, ds, lambda o: o.region != target, timeout_s=30)
        to_new_owner_s = time.monotonic() - killed_at
        # Acks by the new owner after the kill (it may have owned the dataset before).
        await writer.until(
            lambda: sum(a.region == moved.region for a in writer.acked[at_kill:]) >= 8
        )
    finally:
        writer.stop()
        await bounded("the writer", load, 30)

    runs = [
        a.region
        for i, a in enumerate(writer.acked)
        if i == 0 or writer.acked[i - 1].region != a.region
    ]
    assert runs == [start.region, target, moved.region], [
        (a.key, a.region, a.regions) for a in writer.acked
    ]
    # Each ack names distinct regions, at least a quorum of them, the owner first.
    short = [
        a for a in writer.acked if len(set(a.regions)) < 2 or len(set(a.regions)) != len(a.regions)
    ]
    assert short == [], short[:3]
    assert all(a.regions[0] == a.region for a in writer.acked)
    await assert_readable_from(world, moved.region, ds, writer.acked)
    rows = history(world, ds)
    moves = [r for r in rows if int(r["epoch"]) > start.epoch]
    assert [(r["from"], r["to"]) for r in moves] == [
        (start.region, target),
        (target, moved.region),
    ]
    assert_no_overlap(moves, writer.acked, start.region)
    # The failover's RPO exposure, from the agents' own records: zero.
    rpo = failover_row(world, ds, int(moved.epoch))
    assert rpo["rpo_versions"] == 0, rpo
    assert str(rpo["details"].get("rpo_source", "")).startswith("agents"), rpo
    print(
        f"failover of {ds}: new owner {moved.region} {to_new_owner_s:.2f} s after the "
        f"SIGKILL of {target}, rpo_versions {rpo['rpo_versions']}, "
        f"{len(writer.acked)} acked of {writer.attempts} attempts, refused {writer.refused}"
    )
