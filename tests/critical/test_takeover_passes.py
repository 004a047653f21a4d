"""Takeover passes are bounded (agents/replication/sync.py): an agent that starts as
the owner of many critical datasets begins a pass per dataset and copy region, but
only `takeover_passes` of them list and push at a time, and a (dataset, region) never
has two passes at once (asked again while one runs, it runs once more after it).

A unit test: the pass itself (`_takeover_once`, which lists and pushes over gRPC) is
replaced by a probe that counts how many run at once; the store is a real one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest
from placements import critical
from waiting import until

from agents.admission import Admitted
from agents.errors import ResidencyError
from agents.replication.sync import Local, SyncReplication, _UnresolvedError
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore
from agents.store.model import SetRecord
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.placement import Placement
from controlplane.domain.version import Digest, Version
from controlplane.errors import MeridianError, UnavailableError

REPLICAS = ("eu-central", "eu-north")


def placement(dataset: str) -> Placement:
    return critical(dataset, replicas=REPLICAS)


class NoPeers:
    async def address(self, region: str) -> str:
        return f"{region}.invalid:1"

    def forget(self, region: str) -> None:
        pass


class Probe:
    """Stands in for one pass: counts passes at once, overall and per pair."""

    def __init__(self) -> None:
        self.running: list[tuple[str, str]] = []
        self.most = 0
        self.twice: list[tuple[str, str]] = []
        self.done: list[tuple[str, str]] = []
        self.release = asyncio.Event()

    async def __call__(
        self, write: CommittedWrite, region: str, older_than: HLC
    ) -> tuple[int, int, int]:
        pair = (write.dataset, region)
        if pair in self.running:
            self.twice.append(pair)
        self.running.append(pair)
        self.most = max(self.most, len(self.running))
        try:
            await asyncio.wait_for(self.release.wait(), timeout=10)
        finally:
            self.running.remove(pair)
        self.done.append(pair)
        return 0, 0, 0


async def test_takeover_passes_are_bounded(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), takeover_passes=3)
    probe = Probe()
    sync._takeover_once = probe  # type: ignore[method-assign]
    datasets = [f"tri/d{n}" for n in range(8)]
    try:
        for ds in datasets:
            sync.took_over(Admitted(placement(ds), 5, 1), ds, store.clock.now())
        await until(lambda: len(probe.running) == 3, 5, "three passes running")
        probe.release.set()
        await until(lambda: len(probe.done) == 2 * len(datasets), 10, "every pass done")
        assert probe.most == 3
    finally:
        await sync.close()
        store.close()


async def test_a_pass_asked_again_while_it_runs_runs_once_more_after_it(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), takeover_passes=100)
    probe = Probe()
    sync._takeover_once = probe  # type: ignore[method-assign]
    ds = "tri/again"
    try:
        sync.took_over(Admitted(placement(ds), 5, 1), ds, store.clock.now())
        await until(lambda: len(probe.running) == 2, 5, "both passes running")
        # Asked again for a pair while its pass runs (an adopt spreads this way), twice.
        for _ in range(2):
            again = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
            sync._start_pass(again, "eu-central", store.clock.now())
        probe.release.set()
        await until(lambda: len(probe.done) == 3, 10, "every pass done")
        assert probe.twice == []
        assert sorted(probe.done) == [(ds, "eu-central"), (ds, "eu-central"), (ds, "eu-north")]
    finally:
        await sync.close()
        store.close()


async def test_a_pass_waits_for_this_stores_commits_whose_pushes_began(tmp_path: Path) -> None:
    """A critical Put is pushed while its own commit runs here (the servicer's early
    push), so a replica may list a version this store does not list yet. A takeover pass
    that read the replica's listing must wait for that commit, or it takes an acked
    write of this owner for another owner's lone one and has the replica rewind it."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers())
    ds = "tri/early"
    older_than = store.clock.now()
    version = store.put(ds, "k", [b"acked"])  # committed here only once `local` ends
    local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
    real_local = sync._local
    listed = asyncio.Event()
    judged: list[str] = []

    async def their_listing(address: str, dataset: str, **_: bool) -> dict[str, Version]:
        listed.set()
        return {"k": version}

    def our_listing(dataset: str) -> Local:
        # What this store lists while the commit still runs: not the version yet.
        return real_local(dataset) if local.done() else ([], [], [])

    async def held_nowhere_else(*args: object) -> bool:
        judged.append("lone?")
        return True

    async def no_set(*args: object) -> None:
        return None  # the region shows no set

    sync._listing = their_listing  # type: ignore[method-assign]
    sync._local = our_listing  # type: ignore[method-assign]
    sync._held_nowhere_else = held_nowhere_else  # type: ignore[method-assign]
    sync._set_at = no_set  # type: ignore[method-assign]
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds, key="k", version=version)
    try:
        sync._track_commit(ds, local)  # as `replicate` does when the push begins
        running = asyncio.ensure_future(sync._takeover_once(write, "eu-central", older_than))
        await asyncio.wait_for(listed.wait(), 5)
        await asyncio.sleep(0.05)  # the window: the pass must still be waiting
        assert not running.done()
        local.set_result(version)
        assert await asyncio.wait_for(running, 5) == (0, 0, 0)
        assert judged == []  # never taken for an extra, so never a rewind candidate
    finally:
        await sync.close()
        store.close()


async def test_a_cancelled_write_leaves_its_commit_running_and_waited_for(tmp_path: Path) -> None:
    """A Put cancelled while its ack waits for the local commit (a client's deadline)
    must not cancel the commit's task: its thread commits anyway, and a takeover pass
    has to keep waiting for it."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), timeout_s=0.2)
    ds = "tri/cancelled"
    release = threading.Event()
    version = store.put(ds, "k", [b"v"])

    def commit() -> Version:
        release.wait(10)
        return version

    local = asyncio.ensure_future(asyncio.to_thread(commit))
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds, key="k", version=version, local=local)
    try:
        acking = asyncio.ensure_future(sync.replicate(write))
        await until(lambda: ds in sync._committing, 5, "the commit tracked")
        acking.cancel()
        with contextlib.suppress(asyncio.CancelledError, MeridianError):
            await acking
        assert not local.cancelled()
        waiting_pass = asyncio.ensure_future(sync._commits_ended(ds))
        await asyncio.sleep(0.05)  # the window: it must still be waiting
        assert not waiting_pass.done()
        release.set()
        await asyncio.wait_for(waiting_pass, 5)
        assert await local == version
    finally:
        release.set()
        await sync.close()
        store.close()


async def test_a_catch_up_waits_for_this_stores_commits_whose_pushes_began(
    tmp_path: Path,
) -> None:
    """A catch-up that read this store while a write's commit still ran (pushed early,
    its push failed: the catch-up began at once) would not push that write, and the
    region would count toward acks again while it lacks an acked one."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers())
    ds = "tri/early-catch-up"
    version = store.put(ds, "k", [b"acked"])  # committed here only once `local` ends
    local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
    real_local = sync._local
    pushed: list[str] = []

    async def their_listing(address: str, dataset: str, **_: bool) -> dict[str, Version]:
        return {}  # the region lacks everything

    def our_listing(dataset: str) -> Local:
        return real_local(dataset) if local.done() else ([], [], [])

    async def push(region: str, write: CommittedWrite, version: Version, _: float) -> str:
        assert write.key is not None
        pushed.append(write.key)
        return "stored"

    sync._listing = their_listing  # type: ignore[method-assign]
    sync._local = our_listing  # type: ignore[method-assign]
    sync._push = push  # type: ignore[method-assign,assignment]
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
    try:
        sync._track_commit(ds, local)  # as `replicate` does when the push begins
        running = asyncio.ensure_future(sync._catch_up_once(write, "eu-central"))
        await asyncio.sleep(0.05)  # the window: the catch-up must still be waiting
        assert not running.done()
        local.set_result(version)
        assert await asyncio.wait_for(running, 5) == 1
        assert pushed == ["k"]
    finally:
        await sync.close()
        store.close()


async def test_a_pass_waits_for_copies_this_agent_is_still_receiving(tmp_path: Path) -> None:
    """A switchover's target commits the old owner's last copies through the freeze
    while its own takeover pass may already run: the pass (and a catch-up) reads this
    store only once the copies past their owner read have committed (the agent binds
    `copies_received` to Admission.received)."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    received = asyncio.Event()
    asked: list[str] = []

    async def copies_received(dataset: str) -> None:
        asked.append(dataset)
        await received.wait()

    sync = SyncReplication(store, "eu-west", NoPeers(), copies_received=copies_received)
    try:
        waiting = asyncio.ensure_future(sync._commits_ended("tri/copies"))
        await asyncio.sleep(0.05)  # the window: it must still be waiting
        assert not waiting.done() and asked == ["tri/copies"]
        received.set()
        await asyncio.wait_for(waiting, 5)
    finally:
        await sync.close()
        store.close()


async def test_a_catch_up_ends_once_the_policy_moves_the_copy_away(tmp_path: Path) -> None:
    """A catch-up refused for good (the region's residency narrowed) is not retried for
    ever: once the newest write's placement no longer names the region, it ends. A
    write admitted before the change, which still pushes there, does not count it."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)
    sync.retry_initial_s = sync.retry_max_s = 0.01
    ds = "tri/moved-away"
    tries: list[str] = []

    async def refused(address: str, dataset: str, **_: bool) -> dict[str, Version]:
        tries.append(address)
        raise ResidencyError(f"eu-central may not hold {dataset} (test)")

    sync._listing = refused  # type: ignore[method-assign]
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
    sync._latest[ds] = write
    try:
        sync._mark_behind(write, "eu-central")
        await until(lambda: len(tries) >= 3, 5, "the catch-up retries the refusal")
        assert sync.behind(ds) == ["eu-central"]  # still out of acks meanwhile
        moved = critical(ds, replicas=("eu-north",))
        sync._latest[ds] = CommittedWrite(Admitted(moved, 5, 2), ds)  # the next write's
        await until(lambda: sync.behind(ds) == [], 5, "the catch-up ended")
        settled = len(tries)
        await asyncio.sleep(0.05)  # the window: no more tries after it ended
        assert len(tries) == settled

        async def push(region: str, write: CommittedWrite, version: Version, _: float) -> str:
            return "stored"

        sync._push = push  # type: ignore[method-assign,assignment]
        before = critical(ds, replicas=REPLICAS, ack="all")  # the older revision's
        version = store.put(ds, "late", [b"admitted before the change"])
        late = CommittedWrite(Admitted(before, 5, 1), ds, key="late", version=version)
        with pytest.raises(UnavailableError, match="eu-central"):
            await sync.replicate(late)  # stored there, not counted: it lacks versions
    finally:
        await sync.close()
        store.close()


async def test_on_a_quiet_dataset_the_policy_view_ends_a_catch_up_not_a_pass(
    tmp_path: Path,
) -> None:
    """No write comes to a quiet dataset to say the policy moved a copy away: its
    catch-up ends on the placement under the policy the agent applies now (one it
    cannot read decides nothing). Its takeover pass goes on: it adopts acked writes
    the region may be the last to hold. Until a catch-up brings the region level, it
    is not counted toward acks: not by a write admitted before the change (which
    still pushes there), nor once it is named again."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    ds = "tri/quiet"
    placed = critical(ds, replicas=REPLICAS, ack="all")  # every region counts, or none acks
    applied: list[Placement | None] = [None]  # None: the policy cannot be read now

    def placement_now(dataset: str) -> Placement:
        assert dataset == ds
        if applied[0] is None:
            raise UnavailableError("no policy is applied yet (test)")
        return applied[0]

    sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1, placement_now=placement_now)
    sync.retry_initial_s = sync.retry_max_s = 0.01
    tries: list[str] = []

    async def refused(address: str, dataset: str, **_: bool) -> dict[str, Version]:
        tries.append(address)
        raise ResidencyError(f"eu-central may not hold {dataset} (test)")

    async def unreachable(
        write: CommittedWrite, region: str, older_than: HLC
    ) -> tuple[int, int, int]:
        tries.append(region)
        raise UnavailableError(f"{region} is unreachable (test)")

    async def push(region: str, write: CommittedWrite, version: Version, _: float) -> str:
        return "stored"

    sync._listing = refused  # type: ignore[method-assign]
    sync._takeover_once = unreachable  # type: ignore[method-assign]
    sync._push = push  # type: ignore[method-assign,assignment]
    write = CommittedWrite(Admitted(placed, 5, 1), ds)

    def written(revision: int, key: str) -> CommittedWrite:
        version = store.put(ds, key, [key.encode()])
        return CommittedWrite(Admitted(placed, 5, revision), ds, key=key, version=version)

    try:
        sync.took_over(write.admitted, ds, store.clock.now())  # passes to both regions
        sync._mark_behind(write, "eu-central")
        await until(lambda: tries.count("eu-central") >= 3, 5, "both retry")
        await until(lambda: tries.count("eu-central.invalid:1") >= 3, 5, "the catch-up retries")
        assert sync.behind(ds) == ["eu-central"] and len(sync._passes) == 2
        applied[0] = placed  # readable, still naming it: goes on
        count = len(tries)
        await until(lambda: len(tries) >= count + 4, 5, "still retried")
        applied[0] = critical(ds, replicas=("eu-north",))  # the policy moved it away
        await until(lambda: sync.behind(ds) == [], 5, "the catch-up ended")
        passes = tries.count("eu-central")
        await until(lambda: tries.count("eu-central") >= passes + 3, 5, "the pass goes on")
        assert len(sync._passes) == 2

        # A write admitted before the change still pushes there: stored, not counted.
        with pytest.raises(UnavailableError, match="eu-central"):
            await sync.replicate(written(1, "straggler"))
        # Named again: caught up (its listing held back here), then counted.
        listed = asyncio.Event()
        release = asyncio.Event()

        async def held_back(address: str, dataset: str, **_: bool) -> dict[str, Version]:
            listed.set()
            await release.wait()
            return {}

        sync._listing = held_back  # type: ignore[method-assign]
        applied[0] = placed
        with pytest.raises(UnavailableError, match="eu-central"):
            await sync.replicate(written(3, "back"))
        await asyncio.wait_for(listed.wait(), 5)
        assert sync.behind(ds) == ["eu-central"]
        release.set()
        await until(lambda: sync.behind(ds) == [], 5, "eu-central caught up")
        held = await sync.replicate(written(3, "counted"))  # replicas in the order they answered
        assert held[0] == "eu-west" and sorted(held[1:]) == ["eu-central", "eu-north"]
    finally:
        await sync.close()
        store.close()


async def test_a_region_the_policy_adds_is_caught_up_before_it_counts(tmp_path: Path) -> None:
    """A copy region added to the placement mid-epoch holds none of the earlier
    versions while its pushes of new writes succeed: it is caught up (the version
    written before it was added reaches it) before it counts toward an ack."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)
    ds = "tri/added"
    sync._reconciled[ds] = 5  # this epoch's takeover pass ran earlier
    before = critical(ds, replicas=("eu-central",), ack="all")
    after = critical(ds, replicas=("eu-central", "eu-north"), ack="all")
    listed, release = asyncio.Event(), asyncio.Event()
    pushed: list[tuple[str, str]] = []

    async def their_listing(address: str, dataset: str, **_: bool) -> dict[str, Version]:
        listed.set()
        await release.wait()
        return {}  # it holds nothing yet

    async def push(region: str, write: CommittedWrite, version: Version, _: float) -> str:
        assert write.key is not None
        pushed.append((region, write.key))
        return "stored"

    def write_of(placed: Placement, key: str) -> CommittedWrite:
        version = store.put(ds, key, [key.encode()])
        return CommittedWrite(Admitted(placed, 5, 1), ds, key=key, version=version)

    sync._listing = their_listing  # type: ignore[method-assign]
    sync._push = push  # type: ignore[method-assign,assignment]
    try:
        assert await sync.replicate(write_of(before, "old")) == ("eu-west", "eu-central")
        with pytest.raises(UnavailableError, match="eu-north"):
            await sync.replicate(write_of(after, "new"))  # stored there, not counted
        assert ("eu-north", "new") in pushed and sync.behind(ds) == ["eu-north"]
        await asyncio.wait_for(listed.wait(), 5)
        release.set()
        await until(lambda: sync.behind(ds) == [], 5, "eu-north caught up")
        assert ("eu-north", "old") in pushed  # written before it was added
        assert "eu-north" in await sync.replicate(write_of(after, "next"))
    finally:
        release.set()
        await sync.close()
        store.close()


async def test_a_pass_goes_on_while_it_stands_and_ends_once_unplaced(tmp_path: Path) -> None:
    """A takeover pass is begun once per epoch, so one that gave up would never run
    again: a region back after an hour would stay unlevelled. It goes on past what
    used to be its bound (1,000 tries) and ends only when its region leaves the
    placement (or it is fenced, or superseded)."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers())
    sync.retry_initial_s = sync.retry_max_s = 0.0
    ds = "tri/long-pass"
    tries: dict[str, int] = {"eu-central": 0, "eu-north": 0}

    async def unreachable(
        write: CommittedWrite, region: str, older_than: HLC
    ) -> tuple[int, int, int]:
        tries[region] += 1
        if region == "eu-central" and tries[region] > 1_500:
            return 0, 0, 0  # back at last
        raise UnavailableError(f"{region} is unreachable (test)")

    sync._takeover_once = unreachable  # type: ignore[method-assign]
    try:
        sync.took_over(Admitted(placement(ds), 5, 1), ds, store.clock.now())
        await until(lambda: ("tri/long-pass", "eu-central") not in sync._passes, 30, "done")
        assert tries["eu-central"] == 1_501  # not given up at 1,000
        assert ("tri/long-pass", "eu-north") in sync._passes  # still trying
        moved = critical(ds, replicas=("eu-central",))
        sync._latest[ds] = CommittedWrite(Admitted(moved, 5, 2), ds)  # the policy moved it
        await until(lambda: not sync._passes, 10, "the unplaced pass ended")
    finally:
        await sync.close()
        store.close()


async def test_a_pass_in_a_region_of_several_agents_counts_its_siblings_keys_as_ours(
    tmp_path: Path,
) -> None:
    """Each agent of a region commits the keys it is primary of: a takeover pass of one
    agent reads its whole region as ours, so a sibling's key that a replica holds is
    neither adopted here (a copy pulled over the WAN) nor proven lone. The rest of the
    pass is as in a region of one: a key no agent here holds is adopted, a lone write
    of another owner is proven lone (the proof asks every region but the replica's)
    and rewound there, and what the replica lacks of ours is pushed to it."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    adopted: list[str] = []
    asked: list[str] = []
    rewound: list[tuple[str, str]] = []
    pushed: list[tuple[str, str]] = []

    async def adopt(
        dataset: str, key: str, version: Version, region: str, address: str, set_id: str | None
    ) -> bool:
        adopted.append(key)
        return True

    sync = SyncReplication(store, "eu-west", NoPeers(), adopt=adopt, alone_in_region=lambda: False)
    ds = "tri/siblings"
    mine = store.put(ds, "mine", [b"ours, before the epoch"])  # the replica lacks it
    # Before this epoch began (`began`): adopted unless held here.
    sibling = Version.put(HLC(1_000, 0, "eu-west"), 3, Digest.of(b"sib"))
    lost = Version.put(HLC(1_001, 0, "eu-north"), 4, Digest.of(b"lost"))
    began = HLC(mine.hlc.wall_ms + 1_000, 0, "eu-west")
    # After it, held by the replica alone: a deposed owner's write, never acked.
    lone = Version.put(HLC(began.wall_ms + 1, 0, "eu-north"), 4, Digest.of(b"lone"))
    listings = {
        "eu-central.invalid:1": {"sib": sibling, "lost": lost, "lone": lone},  # the replica
        "eu-west.invalid:1": {"sib": sibling, "mine": mine},  # this region, the sibling too
    }

    caught_up = asyncio.Event()  # the catch-up a rewind starts is held at its listing

    async def listing(
        address: str, dataset: str, complete: bool = False, **_: object
    ) -> dict[str, Version]:
        if not complete:
            await caught_up.wait()
        return dict(listings[address])

    async def newest_at(address: str, dataset: str, key: str, **_: object) -> Version | None:
        asked.append(address)
        return listings.get(address, {}).get(key)  # eu-north holds nothing

    async def rewind(
        write: CommittedWrite, region: str, address: str, key: str, version: Version
    ) -> tuple[bool, Version | None]:
        rewound.append((region, key))
        return True, None

    async def push(region: str, write: CommittedWrite, version: Version, _: float) -> str:
        assert write.key is not None
        pushed.append((region, write.key))
        return "stored"

    async def no_set(*_: object) -> bool:
        return False  # the replica shows no set (GetSet)

    sync._listing = listing  # type: ignore[method-assign]
    sync._newest_at = newest_at  # type: ignore[method-assign,assignment]
    sync._rewind = rewind  # type: ignore[method-assign]
    sync._push = push  # type: ignore[method-assign,assignment]
    sync._adopt_set = no_set  # type: ignore[method-assign,assignment]
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
    sync._reconciled[ds] = 5
    try:
        _pushed, took, dropped = await sync._takeover_once(write, "eu-central", began)
        assert adopted == ["lost"] and took == 1
        assert rewound == [("eu-central", "lone")] and dropped == 1
        assert "eu-central.invalid:1" not in asked  # the replica's own copy proves nothing
        assert ("eu-central", "mine") in pushed
        assert sync.behind(ds) == ["eu-central"]  # a rewind there: caught up before acks
    finally:
        await sync.close()
        store.close()


async def test_a_set_a_sibling_agent_shows_is_not_adopted(tmp_path: Path) -> None:
    """A set stays on the agent of the region that took it: a takeover pass of another
    agent of that region finds it shown by the region (a routed GetSet) and leaves it,
    where it would pull its members over the WAN into its own store."""
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    adopted: list[str] = []

    async def adopt(
        dataset: str, key: str, version: Version, region: str, address: str, set_id: str | None
    ) -> bool:
        adopted.append(key)
        return True

    sync = SyncReplication(store, "eu-west", NoPeers(), adopt=adopt, alone_in_region=lambda: False)
    ds = "tri/sibling-set"
    member = Version.put(HLC(1_000, 0, "eu-west"), 3, Digest.of(b"m1"))
    shown = SetRecord(ds, "s1", HLC(1_001, 0, "eu-west"), {"m1": member.hlc}, complete=True)
    asked: list[str] = []

    async def set_at(address: str, dataset: str, set_id: str) -> SetRecord | None:
        asked.append(address)
        return shown  # the replica region shows it, and so does this one (the sibling)

    async def stat_at(address: str, dataset: str, key: str, hlc: HLC) -> tuple[Version, str]:
        return member, "s1"

    sync._set_at = set_at  # type: ignore[method-assign]
    sync._stat_at = stat_at  # type: ignore[method-assign,assignment]
    write = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
    try:
        began = HLC(2_000, 0, "eu-west")
        nothing_here: Local = ([], [], [])
        central = "eu-central.invalid:1"
        took = await sync._adopt_set(write, "eu-central", central, began, nothing_here)
        assert not took and adopted == []
        assert asked == ["eu-central.invalid:1", "eu-west.invalid:1"]

        async def cannot_show(address: str, dataset: str, set_id: str) -> SetRecord | None:
            if address == "eu-west.invalid:1":  # a sibling still writing a checkpoint
                raise UnavailableError("a set held incomplete here (test)")
            return shown

        sync._set_at = cannot_show  # type: ignore[method-assign]
        # Undecided, not a failed pass: the pass spreads what it adopted and retries.
        with pytest.raises(_UnresolvedError, match="shows a newer set is unknown"):
            await sync._adopt_set(write, "eu-central", central, began, nothing_here)
    finally:
        await sync.close()
        store.close()
