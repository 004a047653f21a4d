"""What a takeover pass proves before it rewinds, and the version sets it adopts
(agents/replication/sync.py).

A unit test: three in-process agents, each the real agent API (`AgentService` over a
real store) on a loopback port, stand for the regions' agents; the new owner is
eu-central. Its takeover pass over eu-west lists, probes and adopts through them.
Two ports are faked: the pull of a version (`adopt`, a copy between the stores, as
the Fetch would make it) and the replica's `Rewind` handler (a drop from the store,
without its fencing, which tests/critical/test_takeover.py checks on real agents).

* A delete held by two regions is not lone: the probe must see tombstones (`Stat`
  hides them: an acked delete was once rewound in both regions holding it).
* A lone delete over a lone put over an acked put: both lone ones are rewound, and
  the region shows the acked put again.
* The set a region shows, newer than the new owner's, is adopted with its members,
  unless no other region shows it (then it was never acked)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fakes.admission import MemoryOwners, StaticPolicy, compiled
from harness.fake_peers import StaticPeers
from placements import critical
from waiting import until

from agents.admission import Admission, Admitted
from agents.metrics import AgentMetrics
from agents.replication.sync import SyncReplication, _UnresolvedError
from agents.service import AgentService, CommittedWrite, start_server, stop_server
from agents.service.outcome import Context, unary
from agents.store import ObjectStore
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, UnavailableError
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2

DS = "tri/proofs"
REGIONS = ("eu-west", "eu-central", "eu-north")
PLACEMENT = critical(DS)


class StoreRewinds:
    """The `Rewind` port of an agent: drops the version from its store (unfenced)."""

    def __init__(self, store: ObjectStore, region: str) -> None:
        self.store = store
        self.region = region
        self.rewound: list[str] = []
        # False: answers as an agent of the region that does not hold the version would
        # (drops nothing, shows what it holds: here the same store).
        self.drops = True
        # Set: the calls from this one on (0-based) drop, then fail as a routed Rewind
        # that did not reach every agent of the region does ("dropped where it did").
        self.fails_from: int | None = None

    async def Rewind(  # noqa: N802 - the generated name
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse:
        version = version_from_wire(request.version, "RewindRequest.version")
        dropped = self.drops and self.store.rewind(request.dataset, request.key, version)
        self.rewound.append(version.hlc.text)
        if self.fails_from is not None and len(self.rewound) > self.fails_from:
            raise UnavailableError(f"the rewind did not reach every agent (dropped: {dropped})")
        response = agent_pb2.RewindResponse(dropped=dropped, region=self.region)
        newest = self.store.head(request.dataset, request.key)
        if newest is not None:
            response.newest.CopyFrom(version_to_wire(newest))
        return response


class RewindingService(AgentService):
    """The agent API, with `Rewind` served by `StoreRewinds`."""

    rewinds: StoreRewinds

    async def Rewind(  # noqa: N802 - the generated name
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse:
        return await unary(
            "Rewind", context, self.metrics, lambda: self.rewinds.Rewind(request, context)
        )


@dataclass
class Region:
    name: str
    store: ObjectStore
    service: RewindingService
    server: grpc.aio.Server
    address: str


@pytest.fixture
async def regions(tmp_path: Path) -> AsyncIterator[dict[str, Region]]:
    started: dict[str, Region] = {}
    policy = StaticPolicy(compiled(dict.fromkeys(REGIONS, "EU"), [PLACEMENT]))
    try:
        for name in REGIONS:
            # Three versions kept, so that each rewind below shows the one before (the
            # default two would have pruned the acked put, which the pass then pushes
            # back from the owner: test_takeover.py, on real agents).
            store = ObjectStore(tmp_path / name, clock=HybridClock(name), keep_versions=3)
            metrics = AgentMetrics(name, f"{name}-1")
            owners = MemoryOwners()
            owners.set(DS, "eu-central", 2)
            admission = Admission(name, policy, FencedResource(), owners, metrics)
            service = RewindingService(store, admission, name, f"{name}-1", metrics)
            service.rewinds = StoreRewinds(store, name)
            server, port = await start_server(service, "127.0.0.1:0")
            started[name] = Region(name, store, service, server, f"127.0.0.1:{port}")
        yield started
    finally:
        for region in started.values():
            await stop_server(region.server, None)
            region.store.close()


def owner(regions: dict[str, Region]) -> SyncReplication:
    """eu-central's replication, pulling adopted versions straight from the source store."""
    here = regions["eu-central"].store

    async def adopt(
        dataset: str, key: str, version: Version, region: str, address: str, set_id: str | None
    ) -> bool:
        source = regions[region].store
        if version.is_tombstone:
            here.apply(dataset, key, version, None, set_id=set_id)
        else:
            data = [source.read_bytes(dataset, key, version.hlc)]
            here.apply(dataset, key, version, data, set_id=set_id)
        return True

    peers = StaticPeers({name: region.address for name, region in regions.items()})
    return SyncReplication(here, "eu-central", peers, timeout_s=10, adopt=adopt)


def copy(regions: dict[str, Region], key: str, version: Version, *to: str) -> None:
    """Apply `version`, as eu-west holds it (with the set it was written in), to the
    stores of `to`."""
    west = regions["eu-west"].store
    data = None if version.is_tombstone else [west.read_bytes(DS, key, version.hlc)]
    set_id = west.stat(DS, key, version.hlc, include_deleted=True).set_id
    for name in to:
        regions[name].store.apply(DS, key, version, data, set_id=set_id)


@pytest.fixture
async def sync(regions: dict[str, Region]) -> AsyncIterator[SyncReplication]:
    """eu-central's replication (`owner`), closed after the test."""
    replication = owner(regions)
    try:
        yield replication
    finally:
        await replication.close()


@pytest.fixture
def acked(regions: dict[str, Region]) -> Version:
    """A put of `k` made in eu-west and held by every region (an acked one)."""
    version = regions["eu-west"].store.put(DS, "k", [b"acked by all"])
    copy(regions, "k", version, "eu-central", "eu-north")
    return version


@pytest.fixture
def marked(sync: SyncReplication) -> Iterator[list[str]]:
    """The regions the pass marks behind, recorded: no catch-up is started (it would
    race what the test watches)."""
    regions: list[str] = []
    sync._mark_behind = lambda write, region: regions.append(region)  # type: ignore[method-assign]
    yield regions


@pytest.fixture
def started(sync: SyncReplication) -> Iterator[list[str]]:
    """The regions a takeover pass is started for, recorded, not started."""
    regions: list[str] = []
    sync._start_pass = lambda write, region, older: regions.append(region)  # type: ignore[method-assign]
    yield regions


@pytest.fixture
def missed_and_unproven(regions: dict[str, Region]) -> tuple[Version, HLC]:
    """eu-west holds `a`, an old epoch's write (eu-north has it too) that the owner
    missed, and `b`, made after the epoch began (its proof is the test's to decide):
    the missed version, and the epoch's start."""
    west = regions["eu-west"].store
    missed = west.put(DS, "a", [b"acked at the old epoch"])
    copy(regions, "a", missed, "eu-north")
    older_than = regions["eu-central"].store.clock.now()
    west.put(DS, "b", [b"unproven"])
    return missed, older_than


def epoch_write() -> CommittedWrite:
    return CommittedWrite(Admitted(PLACEMENT, 2, 1), DS)


def newest(region: Region, key: str) -> Version | None:
    return region.store.head(DS, key)


@pytest.mark.usefixtures("acked")
async def test_a_delete_held_by_two_regions_is_not_proven_lone(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    west = regions["eu-west"].store
    delete = west.delete(DS, "k")
    # Held by eu-west alone: lone.
    assert await sync._held_nowhere_else(epoch_write(), "eu-west", "k", delete)
    # eu-north holds the same delete (an acked one, by two regions): not lone,
    # though `Stat` answers "not found" there.
    copy(regions, "k", delete, "eu-north")
    assert not await sync._held_nowhere_else(epoch_write(), "eu-west", "k", delete)


async def test_a_lone_delete_and_the_lone_put_under_it_are_rewound(
    regions: dict[str, Region], acked: Version, sync: SyncReplication
) -> None:
    """eu-west (the deposed owner) holds an acked put, then its own lone put and lone
    delete, both made after the new epoch began: after the pass it shows the acked put."""
    west = regions["eu-west"]
    older_than = regions["eu-central"].store.clock.now()  # the new epoch's start
    lone = west.store.put(DS, "k", [b"the deposed owner's lone write"])
    gone = west.store.delete(DS, "k")
    pushed, adopted, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert (adopted, rewound) == (0, 2)
    assert west.service.rewinds.rewound == [gone.hlc.text, lone.hlc.text]
    assert newest(west, "k") == acked
    assert pushed == 0  # it holds what the owner holds


@pytest.mark.usefixtures("acked")
async def test_an_acked_delete_newer_than_the_epoch_is_adopted_not_rewound(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """The new owner (its clock behind: the delete looks newer than its epoch) missed an
    acked delete held by eu-west and eu-north: adopted, never rewound."""
    west = regions["eu-west"]
    older_than = regions["eu-central"].store.clock.now()
    delete = west.store.delete(DS, "k")
    copy(regions, "k", delete, "eu-north")
    _, adopted, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert (adopted, rewound) == (1, 0)
    assert west.service.rewinds.rewound == []
    assert newest(regions["eu-central"], "k") == delete
    assert newest(west, "k") == delete


def acked_set(regions: dict[str, Region], *, record_in_north: bool) -> tuple[HLC, dict[str, HLC]]:
    """eu-west writes a set of two members (both also in eu-north) and commits it; with
    `record_in_north`, eu-north holds the set record too (an acked set). The epoch's
    start (before all of it) and the members."""
    west = regions["eu-west"].store
    older_than = regions["eu-central"].store.clock.now()
    members: dict[str, HLC] = {}
    for n in range(2):
        key = f"shard-{n}"
        version = west.put(DS, key, [f"shard {n}".encode()], set_id="ckpt")
        copy(regions, key, version, "eu-north")
        members[key] = version.hlc
    record = west.commit_set(DS, "ckpt", members)
    if record_in_north:
        regions["eu-north"].store.apply_set(DS, "ckpt", record.hlc, members)
    return older_than, members


async def test_an_acked_set_the_new_owner_missed_is_adopted(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    older_than, members = acked_set(regions, record_in_north=True)
    central = regions["eu-central"].store
    _, adopted, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert rewound == 0
    assert adopted == 3  # two members and the set record
    shown = central.get_set(DS, "latest")
    want = regions["eu-west"].store.get_set(DS, "latest")
    assert (shown.set_id, shown.hlc, shown.members) == ("ckpt", want.hlc, members)
    assert {k: central.stat(DS, k).set_id for k in members} == dict.fromkeys(members, "ckpt")


async def test_an_adopted_set_completes_under_the_new_owner_s_newer_put_of_a_member(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """The new owner already holds the next checkpoint's put of a member (written at
    its epoch): the missed set's record is applied before its members are pulled, so
    the older member is stored for it (its key's newest stays the head) and the set is
    shown, where LWW alone refused that member and the set never completed here."""
    older_than, members = acked_set(regions, record_in_north=True)
    central = regions["eu-central"].store
    central.clock.observe(max(members.values()))
    newer = central.put(DS, "shard-0", [b"the next checkpoint's shard 0"], set_id="next")
    _, _, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert rewound == 0
    shown = central.get_set(DS, "latest")
    assert (shown.set_id, shown.members) == ("ckpt", members)
    assert central.head(DS, "shard-0") == newer
    assert central.read_bytes(DS, "shard-0", members["shard-0"]) == b"shard 0"


async def test_a_set_only_the_deposed_owner_shows_is_not_adopted(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """Its members are held by two regions (adopted), but no region but eu-west shows
    the set record made after the epoch began: never acked, so not shown here."""
    older_than, members = acked_set(regions, record_in_north=False)
    central = regions["eu-central"].store
    _, adopted, _ = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert adopted == 2  # the members only
    assert {k: central.stat(DS, k).version.hlc for k in members} == members
    assert central.list_sets(DS) == []


async def test_members_adopted_key_by_key_keep_the_set_they_were_written_in(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """The per-key pass adopts the members of a set no copy region shows yet: each is
    stored as a member of its set (a row without it loses a member's protections, and
    the owner would push it on without it)."""
    older_than, members = acked_set(regions, record_in_north=False)
    _, adopted, _ = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    central = regions["eu-central"].store
    assert adopted == 2 and central.list_sets(DS) == []  # the members only
    assert {k: central.stat(DS, k).set_id for k in members} == dict.fromkeys(members, "ckpt")
    assert [(k, s) for k, _, s in sync._local(DS)[0]] == [(k, "ckpt") for k in sorted(members)]


async def test_a_delete_written_in_a_set_is_adopted_with_its_set(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """A delete is not shown by Stat: its set comes from the listing it was found in."""
    west = regions["eu-west"].store
    older_than = regions["eu-central"].store.clock.now()
    west.put(DS, "k", [b"before the set"])
    gone = west.delete(DS, "k", set_id="ckpt")
    copy(regions, "k", gone, "eu-north")
    _, adopted, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert (adopted, rewound) == (1, 0)
    assert regions["eu-central"].store.stat(DS, "k", include_deleted=True).set_id == "ckpt"


@pytest.mark.usefixtures("acked")
async def test_a_rewind_is_followed_by_the_owners_version_of_the_key(
    regions: dict[str, Region], sync: SyncReplication, marked: list[str]
) -> None:
    """The new owner's write `y` of this epoch reached eu-west while eu-west held the
    deposed owner's later lone write `x`: eu-west answered "older" (counted: it holds
    something newer), so once the pass rewinds `x`, nothing but the pass itself would
    bring eu-west `y`, though `y` is newer than the epoch's start."""
    west, central = regions["eu-west"], regions["eu-central"]
    older_than = central.store.clock.now()
    y = central.store.put(DS, "k", [b"the new owner's write"])
    regions["eu-north"].store.apply(DS, "k", y, [b"the new owner's write"])
    west.store.clock.observe(y.hlc)
    x = west.store.put(DS, "k", [b"the deposed owner's lone write, after y"])
    assert x.hlc > y.hlc
    pushed: list[tuple[str, str, str]] = []

    async def push(region: str, write: CommittedWrite, version: Version, deadline: float) -> str:
        # The Replicate port: applied to that region's store as the replica would.
        data = central.store.read_bytes(DS, "k", version.hlc)
        regions[region].store.apply(DS, write.key or "", version, [data])
        pushed.append((region, write.key or "", version.hlc.text))
        return region

    sync._push = push  # type: ignore[method-assign]
    # The catch-up the rewind starts would push `y` too, racing the pass (it made this
    # test flaky): `marked` records it, not started, so the pass's own push is seen.
    _, _, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert rewound == 1
    assert pushed == [("eu-west", "k", y.hlc.text)]
    assert newest(west, "k") == y
    assert marked == ["eu-west"]


def pushing_from(regions: dict[str, Region], fail_first: int = 0) -> tuple[object, list[str]]:
    """A Replicate port applying to the region's store as a replica would, failing its
    first `fail_first` calls (a blip), and the versions it was called with."""
    central = regions["eu-central"].store
    calls: list[str] = []

    async def push(region: str, write: CommittedWrite, version: Version, deadline: float) -> str:
        calls.append(version.hlc.text)
        if len(calls) <= fail_first:
            raise UnavailableError("a blip on the way to the replica")
        data = central.read_bytes(DS, write.key or "", version.hlc)
        regions[region].store.apply(DS, write.key or "", version, [data])
        return region

    return push, calls


@pytest.mark.usefixtures("acked")
async def test_a_rewound_region_gets_the_owners_version_even_when_the_push_fails_once(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """As above, but the pass's push of `y` fails once: its retry no longer sees the
    rewound key as an extra, so only the catch-up the rewind started brings eu-west `y`
    (review: without it eu-west kept the old version, and `y` sat in one region)."""
    west, central = regions["eu-west"], regions["eu-central"]
    older_than = central.store.clock.now()
    y = central.store.put(DS, "k", [b"the new owner's write"])
    west.store.clock.observe(y.hlc)
    west.store.put(DS, "k", [b"the deposed owner's lone write, after y"])
    sync.retry_initial_s = 0.01
    sync._reconciled[DS] = epoch_write().admitted.epoch  # this epoch's pass, as started
    push, _ = pushing_from(regions, fail_first=1)
    sync._push = push  # type: ignore[method-assign]
    await sync._reconcile(epoch_write(), "eu-west", older_than)
    await until(lambda: newest(west, "k") == y, 30, "eu-west to hold the owner's write")


@pytest.mark.usefixtures("acked")
async def test_a_rewound_region_gets_the_owners_write_committed_during_the_pass(
    regions: dict[str, Region], sync: SyncReplication
) -> None:
    """The new owner commits `y` while the pass proves eu-west's `x` lone, and eu-west
    answers "older" to `y` (counted); the pass's snapshot lacks `y`, so only the
    catch-up the rewind started brings it (review: eu-west kept the old version)."""
    west, central = regions["eu-west"], regions["eu-central"]
    older_than = central.store.clock.now()
    now = west.store.clock.now()
    west.store.clock.observe(HLC(now.wall_ms + 500, 0, "eu-central"))  # within the skew
    west.store.put(DS, "k", [b"the deposed owner's lone write"])
    sync._reconciled[DS] = epoch_write().admitted.epoch  # this epoch's pass, as started
    proof = sync._held_nowhere_else
    during: list[Version] = []

    async def held(write: CommittedWrite, region: str, key: str, version: Version) -> object:
        if not during:  # y lands at eu-west as "older" than x, and is acked meanwhile
            y = central.store.put(DS, "k", [b"y"])
            west.store.apply(DS, "k", y, [b"y"])
            during.append(y)
        return await proof(write, region, key, version)

    sync._held_nowhere_else = held  # type: ignore[method-assign,assignment]
    push, _ = pushing_from(regions)
    sync._push = push  # type: ignore[method-assign]
    await sync._reconcile(epoch_write(), "eu-west", older_than)
    await until(lambda: newest(west, "k") == during[0], 30, "eu-west to hold the owner's write")


async def test_a_rewind_that_dropped_nothing_is_not_counted_done(
    regions: dict[str, Region], acked: Version, sync: SyncReplication
) -> None:
    """eu-west lists a lone write, but the agent the Rewind reaches drops nothing (another
    agent of the region holds it): the pass must not count it rewound and move on, it
    leaves the key unresolved and fails retriable, so it is listed and rewound again."""
    west = regions["eu-west"]
    older_than = regions["eu-central"].store.clock.now()
    lone = west.store.put(DS, "k", [b"the deposed owner's lone write"])
    west.service.rewinds.drops = False
    with pytest.raises(UnavailableError, match="dropped nothing") as caught:
        await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert caught.value.retriable
    assert west.service.rewinds.rewound == [lone.hlc.text]  # asked once
    assert newest(west, "k") == lone
    # Asked again where it is held, the retried pass rewinds it.
    west.service.rewinds.drops = True
    _, _, rewound = await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert rewound == 1
    assert newest(west, "k") == acked


async def test_what_a_pass_adopted_is_spread_though_another_key_is_left_unresolved(
    regions: dict[str, Region],
    sync: SyncReplication,
    started: list[str],
    missed_and_unproven: tuple[Version, HLC],
) -> None:
    """eu-west holds an old epoch's write the owner missed (adopted, no proof needed) and
    a newer one whose proof cannot be made now. The pass fails retriable, and its retry
    finds nothing left to adopt: the adopted version must go to eu-north's pass now."""
    missed, older_than = missed_and_unproven

    async def unknown(*args: object) -> bool:
        raise _UnresolvedError("eu-north does not answer")

    sync._held_nowhere_else = unknown  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="could not decide 1"):
        await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert regions["eu-central"].store.head(DS, "a") == missed  # adopted
    assert started == ["eu-north"]


@pytest.mark.usefixtures("acked")
async def test_a_rewind_then_a_failed_adoption_leaves_the_region_marked_behind(
    regions: dict[str, Region], sync: SyncReplication, marked: list[str]
) -> None:
    """eu-west shows the deposed owner's lone `x2` over `x1`, an old epoch's write the
    owner missed: `x2` is rewound, then adopting `x1` fails. The key is not settled, yet
    a version was dropped there (review: only an unresolved key marked it)."""
    west = regions["eu-west"].store
    x1 = west.put(DS, "k", [b"acked at the old epoch, missed"])
    copy(regions, "k", x1, "eu-north")
    older_than = regions["eu-central"].store.clock.now()
    west.clock.observe(older_than)
    x2 = west.put(DS, "k", [b"the deposed owner's lone write"])

    async def adopt(*args: object) -> bool:
        raise UnavailableError("the pull of x1 failed")

    sync.adopt = adopt
    with pytest.raises(UnavailableError, match="pull of x1"):
        await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert regions["eu-west"].service.rewinds.rewound == [x2.hlc.text]
    assert newest(regions["eu-west"], "k") == x1
    assert marked == ["eu-west"]


async def test_a_rewind_that_dropped_but_failed_still_brings_the_owners_version(
    regions: dict[str, Region], acked: Version, sync: SyncReplication
) -> None:
    """The routed Rewind of eu-west's lone `x` drops it on the agent holding it but fails
    (another agent did not answer). The retried pass sees nothing extra there and leaves
    this epoch's `y` to its own push, answered "older" against `x`: only a catch-up
    brings eu-west `y` (review: none was started)."""
    west, central = regions["eu-west"], regions["eu-central"]
    older_than = central.store.clock.now()
    y = central.store.put(DS, "k", [b"the new owner's write"])
    regions["eu-north"].store.apply(DS, "k", y, [b"the new owner's write"])
    west.store.clock.observe(y.hlc)
    west.store.put(DS, "k", [b"the deposed owner's lone write, after y"])
    west.service.rewinds.fails_from = 0
    sync.retry_initial_s = 0.01
    sync._reconciled[DS] = epoch_write().admitted.epoch  # this epoch's pass, as started
    push, _ = pushing_from(regions)
    sync._push = push  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="did not reach every agent"):
        await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert newest(west, "k") == acked  # dropped, though the call failed
    west.service.rewinds.fails_from = None
    await sync._reconcile(epoch_write(), "eu-west", older_than)
    await until(lambda: newest(west, "k") == y, 10, "eu-west to hold the owner's write")


async def test_what_a_pass_adopted_is_spread_though_a_later_key_fails(
    regions: dict[str, Region],
    sync: SyncReplication,
    started: list[str],
    missed_and_unproven: tuple[Version, HLC],
) -> None:
    """As above, but the later key's proof fails outright (an agent not answering at all,
    not an undecided proof): the pass raises, and what it adopted before still goes to
    eu-north's pass (review: the exception left before the spreading)."""
    missed, older_than = missed_and_unproven

    async def down(*args: object) -> bool:
        raise UnavailableError("eu-north (127.0.0.1:1) is unavailable")

    sync._held_nowhere_else = down  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="is unavailable"):
        await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert regions["eu-central"].store.head(DS, "a") == missed  # adopted
    assert started == ["eu-north"]


@pytest.mark.usefixtures("acked")
async def test_a_rewind_refused_as_invalid_still_marks_the_region_behind(
    regions: dict[str, Region], sync: SyncReplication, marked: list[str]
) -> None:
    """eu-west's lone `x`'s rewind is refused as invalid input (an agent that predates
    rewinding deletes, in a region where another agent may have dropped it already): the
    key is left as it shows, and the region is marked behind as after a drop (review)."""
    west = regions["eu-west"].store
    older_than = regions["eu-central"].store.clock.now()
    west.clock.observe(older_than)
    west.put(DS, "k", [b"the deposed owner's lone write"])

    async def refused(*args: object) -> tuple[bool, None]:
        raise InvalidInputError("eu-west (agent b): Rewind of a delete is not known here")

    sync._rewind = refused  # type: ignore[method-assign]
    await sync._takeover_once(epoch_write(), "eu-west", older_than)
    assert marked == ["eu-west"]
