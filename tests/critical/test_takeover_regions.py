"""A takeover pass proves "lone" in regions of several agents (agents/replication/sync.py,
agents/routing/service.py), on real agent processes and a real etcd.

eu-west has two agents, each object on one of them (`r` = 1); eu-central and eu-north
one each. The new owner's replication is the real `SyncReplication`, in the test
process (its `adopt` is counted, not run), asking those agents:

* A listing that could not reach an agent of a region (here a registration whose
  agent refuses connections, as a crashed one does until its lease lapses) is no
  proof: a `complete` listing fails, and the proof decides nothing (before, the
  routed List skipped that agent and the version looked lone: an acked write held
  there would be rewound).
* A proof that times out (eu-north's agent paused) decides nothing either: the pass
  leaves the version as it is and is retried (before, it adopted it: a deposed
  owner's never-acked write, newer than what this epoch acked, spread over it).
* A Rewind reaches every agent of the region, not only the one asked (before, that
  one answered "dropped nothing" and the version stayed on the other agent).
"""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from critical_helpers import kill_all, prepare_critical_world, wait_ready
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess
from harness.fake_peers import StaticPeers
from placements import critical
from waiting import until

from agents.admission import Admitted
from agents.placement import hrw
from agents.placement.members import Member
from agents.replication.sync import SyncReplication, _UnresolvedError
from agents.routing.peers import ROUTED_KEY
from agents.service import CommittedWrite
from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError
from controlplane.loopback import free_port
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

PLACEMENT = critical("tri/regions", policy="tri", failover_order=())
# The owner the versions are pushed from and rewound for: no agent runs in us-east, so
# none makes a takeover pass of its own.
OWNER = "us-east"
LAYOUT = (("eu-west", 2), ("eu-central", 1), ("eu-north", 1))


@dataclass
class World:
    env: dict[str, str]
    agents: dict[str, list[AgentProcess]]
    ids: dict[str, str]  # address -> agent id
    source: ObjectStore  # makes the versions the agents are given

    def one(self, region: str) -> AgentProcess:
        return self.agents[region][0]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str) -> Iterator[World]:
    """One world for the module (the agents start once): each test has a dataset of its
    own, and leaves every agent running and answering."""
    tmp_path = tmp_path_factory.mktemp("regions")
    clear_keyspace(etcd_endpoint)
    critical_world = prepare_critical_world(tmp_path / "world", etcd_endpoint)
    # One copy per object in eu-west, and no rebalance pass while a test runs: which
    # agent holds a version is the test's choice.
    env = {
        **critical_world,
        "MERIDIAN_REGION_COPIES": "eu-west=1,eu-north=1",
        "MERIDIAN_REBALANCE_INTERVAL_S": "3600",
    }
    agents: dict[str, list[AgentProcess]] = {}
    source = ObjectStore(tmp_path / "source", clock=HybridClock("eu-west"))
    try:
        for region, count in LAYOUT:
            for n in range(count):
                proc = AgentProcess(
                    region, tmp_path / f"{region}-{n}", env, tmp_path / f"{region}-{n}.log"
                )
                proc.spawn()
                agents.setdefault(region, []).append(proc)
        ids = wait_ready(p for procs in agents.values() for p in procs)
        yield World(env, agents, ids, source)
    finally:
        kill_all(p for procs in agents.values() for p in procs)
        source.close()


@pytest.fixture
async def coord(etcd_endpoint: str) -> AsyncIterator[EtcdCoordination]:
    """etcd, as a controller writes it (the module's world is kept: no keyspace reset)."""
    async with EtcdCoordination([etcd_endpoint], timeout_s=5.0) as connected:
        yield connected


class CountedAdopt:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(
        self,
        dataset: str,
        key: str,
        version: Version,
        region: str,
        address: str,
        set_id: str | None = None,
    ) -> bool:
        self.calls.append(f"{key}@{version.hlc.text} from {region}")
        return True


def owner(
    world: World,
    adopt: CountedAdopt,
    tmp_path: Path,
    region: str = "eu-central",
    timeout_s: float = 5.0,
) -> SyncReplication:
    """`region`'s replication (its own store empty), asking one agent per region. Its
    calls (routed Lists and Rewinds, expected to succeed) get `timeout_s`: 1 s was
    missed on a loaded machine of 2 cores."""
    store = ObjectStore(tmp_path / "owner", clock=HybridClock(region))
    addresses = {region: procs[0].address for region, procs in world.agents.items()}
    sync = SyncReplication(store, region, StaticPeers(addresses), timeout_s=timeout_s, adopt=adopt)
    sync.retry_initial_s = sync.retry_max_s = 0.05
    return sync


def epoch_write(ds: str, epoch: int = 1) -> CommittedWrite:
    return CommittedWrite(Admitted(dataclasses.replace(PLACEMENT, dataset=ds), epoch, 1), ds)


async def give(
    proc: AgentProcess, world: World, ds: str, key: str, data: bytes, *, epoch: int
) -> Version:
    """`data` as a version of `key` held by `proc` alone (see `replicate`)."""
    version = world.source.put(ds, key, [data])
    await replicate(proc, ds, key, version, data, epoch)
    return version


async def replicate(
    proc: AgentProcess, ds: str, key: str, version: Version, data: bytes, epoch: int
) -> None:
    """`version` stored on `proc` alone (a Replicate marked as routed: stored there, not
    spread to the region's other agents), sent by `OWNER` at `epoch`."""
    header = agent_pb2.ReplicateHeader(
        dataset=ds, key=key, version=version_to_wire(version), epoch=epoch, origin_region=OWNER
    )

    async def frames() -> AsyncIterator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)
        if not version.is_tombstone:
            yield agent_pb2.ReplicateRequest(chunk=data)

    async with grpc.aio.insecure_channel(proc.address) as channel:
        await agent_pb2_grpc.AgentStub(channel).Replicate(
            frames(),  # type: ignore[arg-type]
            metadata=((ROUTED_KEY, "test"),),
            timeout=10,
        )


async def seeding_owner(coord: EtcdCoordination, ds: str) -> int:
    """Name `OWNER` the owner of `ds`; its epoch."""
    epoch = await Ownership(coord).claim(ds, OWNER, expect_epoch=0, reason="test", actor="test")
    assert epoch > 0
    return epoch


async def held_here(proc: AgentProcess, ds: str, key: str) -> list[str]:
    """The versions `proc` itself holds of `key` (its own listing, not the region's)."""
    async with grpc.aio.insecure_channel(proc.address) as channel:
        page = await agent_pb2_grpc.AgentStub(channel).List(
            agent_pb2.ListRequest(dataset=ds, prefix=key, include_deleted=True),
            metadata=((ROUTED_KEY, "test"),),
            timeout=10,
        )
    return [info.version.hlc for info in page.objects if info.key == key]


async def list_region(proc: AgentProcess, ds: str, *, complete: bool) -> agent_pb2.ListResponse:
    async with grpc.aio.insecure_channel(proc.address) as channel:
        response: agent_pb2.ListResponse = await agent_pb2_grpc.AgentStub(channel).List(
            agent_pb2.ListRequest(dataset=ds, include_deleted=True, complete=complete),
            timeout=10,
        )
    return response


async def test_a_listing_that_misses_an_agent_proves_nothing(
    world: World, coord: EtcdCoordination, tmp_path: Path
) -> None:
    ds = "tri/regions-list"
    west, north = world.one("eu-west"), world.one("eu-north")
    # Only eu-west holds the version (a deposed owner's write, or one acked with an
    # agent of eu-north that cannot answer now).
    epoch = await seeding_owner(coord, ds)
    version = await give(west, world, ds, "k", b"held in eu-west", epoch=epoch)
    # An agent of eu-north that is registered but refuses connections (crashed; its
    # lease not lapsed yet): it may hold that version.
    ghost = keys.agents_of("eu-north") + "ghost"
    await coord.put(
        ghost, json.dumps({"id": "ghost", "endpoint": f"127.0.0.1:{free_port()}"}).encode()
    )

    async def sees_ghost() -> bool:
        try:
            await list_region(north, ds, complete=True)
        except grpc.aio.AioRpcError as err:
            return err.code() == grpc.StatusCode.UNAVAILABLE and "ghost" in (err.details() or "")
        return False

    await until(sees_ghost, 15, "eu-north's agent to count the ghost in a complete listing")
    await list_region(north, ds, complete=False)  # a reader's listing still answers

    sync = owner(world, CountedAdopt(), tmp_path)
    try:
        with pytest.raises(_UnresolvedError, match="eu-north"):
            await sync._held_nowhere_else(epoch_write(ds), "eu-west", "k", version)
        # Once the agent is gone from the region (its lease lapsed), the proof is made.
        await coord.delete(ghost)

        async def proven() -> bool:
            try:
                return await sync._held_nowhere_else(epoch_write(ds), "eu-west", "k", version)
            except _UnresolvedError:
                return False

        await until(proven, 15, "the proof once eu-north answers for all its agents")
    finally:
        await coord.delete(ghost)  # the next test's region answers for all its agents
        await sync.close()
        sync.store.close()


async def test_a_proof_that_times_out_adopts_nothing_and_the_pass_is_retried(
    world: World, coord: EtcdCoordination, tmp_path: Path
) -> None:
    ds = "tri/regions-timeout"
    west, north = world.one("eu-west"), world.one("eu-north")
    older_than = world.source.clock.now()  # the epoch began before the version
    epoch = await seeding_owner(coord, ds)
    version = await give(west, world, ds, "k", b"maybe lone", epoch=epoch)
    adopt = CountedAdopt()
    # Shorter, as eu-north's proof waits it out; the calls that must succeed (eu-west's
    # listing, eu-central's proof) still have room under load, and the match says that
    # the one not decided is eu-north's.
    sync = owner(world, adopt, tmp_path, timeout_s=5.0)
    north.signal(signal.SIGSTOP)  # its kernel still accepts: every call times out
    try:
        with pytest.raises(
            UnavailableError, match=r"could not decide 1 .*whether eu-north holds k"
        ) as caught:
            await sync._takeover_once(epoch_write(ds), "eu-west", older_than)
        assert caught.value.retriable  # the pass is retried (`_retried`), not given up
        assert adopt.calls == []  # neither adopted...
        assert await held_here(west, ds, "k") == [version.hlc.text]  # ...nor rewound
    finally:
        north.signal(signal.SIGCONT)
    try:
        # Answered (once the resumed agent answers again), the proof is made: eu-west
        # alone holds it. A proof that decides "held elsewhere" fails at once.
        async def proven() -> bool:
            try:
                lone = await sync._held_nowhere_else(epoch_write(ds), "eu-west", "k", version)
            except _UnresolvedError:
                return False
            assert lone, "eu-west's version was read as held elsewhere"
            return True

        await until(proven, 15, "the proof once eu-north's agent answers again")
    finally:
        await sync.close()
        sync.store.close()


async def test_a_rewind_reaches_the_agent_of_the_region_that_holds_the_version(
    world: World, coord: EtcdCoordination, tmp_path: Path
) -> None:
    ds = "tri/regions-rewind"
    epoch = await seeding_owner(coord, ds)
    first, second = world.agents["eu-west"]
    key = _primary_key(world, ds, first)  # held by its owner: no rebalance would move it
    version = await give(first, world, ds, key, b"lone", epoch=epoch)
    assert await held_here(second, ds, key) == []
    sync = owner(world, CountedAdopt(), tmp_path, region=OWNER)
    try:
        # Asked of the agent that does not hold it, as the owner's peers may pick it.
        dropped, after = await sync._rewind(
            epoch_write(ds, epoch), "eu-west", second.address, key, version
        )
    finally:
        await sync.close()
        sync.store.close()
    assert dropped
    assert after is None
    assert await held_here(first, ds, key) == []


async def test_a_delete_is_forgotten_only_once_no_agent_shows_anything_else(
    world: World, coord: EtcdCoordination, tmp_path: Path
) -> None:
    """The proof of a critical tombstone's expiry asks each agent of each copy region
    (the routed listing's `lowest`): a second agent of eu-west that missed the delete
    still shows the put, though the region's newest is the delete."""
    ds = "tri/regions-expiry"
    epoch = await seeding_owner(coord, ds)
    first, second = world.agents["eu-west"]
    central, north = world.one("eu-central"), world.one("eu-north")
    put = await give(first, world, ds, "k", b"a checkpoint shard", epoch=epoch)
    for proc in (second, central, north):
        await replicate(proc, ds, "k", put, b"a checkpoint shard", epoch)
    gone = world.source.delete(ds, "k")
    for proc in (first, central, north):
        await replicate(proc, ds, "k", gone, b"", epoch)
    # "n": deleted where it is held; eu-north never held it (nothing: allowed).
    n_put = await give(first, world, ds, "n", b"another shard", epoch=epoch)
    await replicate(central, ds, "n", n_put, b"another shard", epoch)
    n_gone = world.source.delete(ds, "n")
    for proc in (first, central):
        await replicate(proc, ds, "n", n_gone, b"", epoch)
    placement = dataclasses.replace(PLACEMENT, dataset=ds)
    sync = owner(world, CountedAdopt(), tmp_path, region=OWNER)
    deletes = [("k", gone.hlc.text), ("n", n_gone.hlc.text)]
    try:
        assert await sync.forgettable_deletes(ds, placement, deletes) == {"n"}
        await replicate(second, ds, "k", gone, b"", epoch)  # caught up
        assert await sync.forgettable_deletes(ds, placement, deletes) == {"k", "n"}
        # A newer version shown by any agent (a lone write a takeover may rewind, the
        # put showing again) keeps it, though another agent of its region shows the
        # delete: the lowest of the two is the delete, the highest is not.
        newer = world.source.put(ds, "k", [b"a lone write"])
        await replicate(second, ds, "k", newer, b"a lone write", epoch)
        assert await sync.forgettable_deletes(ds, placement, deletes) == {"n"}
    finally:
        await sync.close()
        sync.store.close()


def _primary_key(world: World, ds: str, proc: AgentProcess) -> str:
    """A key whose owner (r = 1) among eu-west's agents is `proc`."""
    members = [Member(world.ids[p.address], p.address) for p in world.agents["eu-west"]]
    for n in range(1000):
        key = f"k{n}"
        if hrw.rank(hrw.placement_key(ds, key), members)[0].endpoint == proc.address:
            return key
    raise AssertionError("no key ranks that agent first")
