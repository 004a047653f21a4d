"""The owner's ack of a write pushed while it commits (agents/replication/sync.py,
`CommittedWrite.local`), on faked pushes: the replicas' quorum is not enough, the ack
waits for the owner's own commit, and a failed commit fails the write."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from placements import critical
from waiting import until

from agents.admission import Admitted
from agents.replication import SyncReplication
from agents.replication.sync import _lacks
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore, StorageError
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version
from controlplane.errors import UnavailableError
from meridian.convert import version_to_wire

PLACEMENT = critical("ckpt/overlap", policy="checkpoints", failover_mode="automatic")


class NoPeers:
    async def address(self, region: str) -> str:
        raise AssertionError(f"no call to {region} here: the pushes are faked")

    def forget(self, region: str) -> None:
        pass


def replication(store: ObjectStore, pushed: list[str]) -> SyncReplication:
    sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)

    async def push(region: str, _w: CommittedWrite, _v: Version, _deadline: float) -> str:
        pushed.append(region)
        return region

    sync._push = push  # type: ignore[method-assign]
    sync._reconciled[PLACEMENT.dataset] = 5  # no takeover pass: this epoch began earlier
    return sync


def write(local: asyncio.Future[Version]) -> CommittedWrite:
    version = Version(HybridClock("eu-west").now(), "delete", 0, None)
    return CommittedWrite(
        Admitted(PLACEMENT, 5, 1), PLACEMENT.dataset, key="k", version=version, local=local
    )


async def test_the_ack_waits_for_the_owners_own_commit(tmp_path: Path) -> None:
    pushed: list[str] = []
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = replication(store, pushed)
        local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
        w = write(local)
        acking = asyncio.create_task(sync.replicate(w))
        await until(lambda: len(pushed) == 2, 5, "both pushes")
        # Both replicas hold it (a quorum without the owner), but the owner's copy
        # is not durable yet: no ack (a bounded look: nothing is to happen).
        done, _ = await asyncio.wait({acking}, timeout=0.2)
        assert sorted(pushed) == ["eu-central", "eu-north"] and not done
        assert w.version is not None
        local.set_result(w.version)
        regions = await asyncio.wait_for(acking, timeout=5)
        assert regions[0] == "eu-west" and len(regions) >= 2
        await sync.close()


async def test_a_failed_own_commit_fails_the_write_whatever_the_replicas_hold(
    tmp_path: Path,
) -> None:
    pushed: list[str] = []
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = replication(store, pushed)
        local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
        local.set_exception(StorageError("the disk is gone (test)"))
        with pytest.raises(StorageError, match="the disk is gone"):
            await asyncio.wait_for(sync.replicate(write(local)), timeout=5)
        await sync.close()


class Gated:
    """A SyncReplication whose pushes (ack: all) each wait for a future of the test's,
    `gates[(key, region)]`, and whose regions marked behind are only recorded."""

    def __init__(self, store: ObjectStore) -> None:
        self.every = dataclasses.replace(PLACEMENT, ack="all")
        self.gates: dict[tuple[str, str], asyncio.Future[str]] = {}
        self.behind: list[str] = []
        self.clock = HybridClock("eu-west")
        self.sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)
        self.sync._push = self._push  # type: ignore[method-assign]
        self.sync._mark_behind = lambda _w, region: self.behind.append(region)  # type: ignore[method-assign]
        self.sync._reconciled[PLACEMENT.dataset] = 5

    async def _push(self, region: str, w: CommittedWrite, _v: Version, _deadline: float) -> str:
        loop = asyncio.get_running_loop()
        return await self.gates.setdefault((w.key or "", region), loop.create_future())

    def write_of(self, key: str) -> CommittedWrite:
        version = Version(self.clock.now(), "delete", 0, None)
        every = self.every
        return CommittedWrite(Admitted(every, 5, 1), every.dataset, key=key, version=version)


async def test_a_replica_counts_toward_an_ack_only_once_every_earlier_push_to_it_succeeded(
    tmp_path: Path,
) -> None:
    """Two writes pushed at once (ack: all, so every replica must count): the second's
    pushes end first, but it is not acked while the first's still run, and when the
    first's push to eu-central fails, eu-central does not count for the second either
    (it may lack the first), while the first's failure marks eu-central behind."""
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        gated = Gated(store)
        sync, gates, behind, write_of = gated.sync, gated.gates, gated.behind, gated.write_of
        first = asyncio.create_task(sync.replicate(write_of("k1")))
        second = asyncio.create_task(sync.replicate(write_of("k2")))
        await until(lambda: len(gates) == 4, 5, "four pushes")
        for region in ("eu-central", "eu-north"):
            gates[("k2", region)].set_result(region)
        done, _ = await asyncio.wait({second}, timeout=0.2)  # bounded: nothing may end
        assert not done, "acked while an earlier push to the same replicas still ran"
        gates[("k1", "eu-north")].set_result("eu-north")
        gates[("k1", "eu-central")].set_exception(UnavailableError("link cut (test)"))
        with pytest.raises(UnavailableError, match="link cut"):
            await asyncio.wait_for(first, timeout=5)
        with pytest.raises(UnavailableError, match="an earlier push to eu-central"):
            await asyncio.wait_for(second, timeout=5)
        assert behind == ["eu-central"]
        # A third write, pushed after both ended, waits for nothing that failed before.
        third = asyncio.create_task(sync.replicate(write_of("k3")))
        await until(lambda: len(gates) == 6, 5, "the third's pushes")
        for region in ("eu-central", "eu-north"):
            gates[("k3", region)].set_result(region)
        regions = await asyncio.wait_for(third, timeout=5)
        assert sorted(regions) == ["eu-central", "eu-north", "eu-west"]
        await sync.close()


async def test_a_push_failing_fast_does_not_let_a_later_one_skip_an_earlier_one_still_running(
    tmp_path: Path,
) -> None:
    """k1's push to eu-central runs on; k2's fails at once; k3's, begun after that
    failure, succeeds: k3 still waits for k1's push to end (were it to count now,
    eu-central might lack k1), and fails as one after a failed push."""
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        gated = Gated(store)
        sync, gates, write_of = gated.sync, gated.gates, gated.write_of
        first = asyncio.create_task(sync.replicate(write_of("k1")))
        second = asyncio.create_task(sync.replicate(write_of("k2")))
        await until(lambda: len(gates) == 4, 5, "k1's and k2's pushes")
        gates[("k2", "eu-north")].set_result("eu-north")
        gates[("k2", "eu-central")].set_exception(UnavailableError("k2 refused (test)"))
        with pytest.raises(UnavailableError, match="k2 refused"):
            await asyncio.wait_for(second, timeout=5)
        third = asyncio.create_task(sync.replicate(write_of("k3")))
        await until(lambda: len(gates) == 6, 5, "k3's pushes")
        for region in ("eu-central", "eu-north"):
            gates[("k3", region)].set_result(region)
        done, _ = await asyncio.wait({third}, timeout=0.2)  # bounded: nothing may end
        assert not done, "k3 ended while k1's push to eu-central still ran"
        for region in ("eu-central", "eu-north"):
            gates[("k1", region)].set_result(region)
        assert sorted(await asyncio.wait_for(first, timeout=5)) == [
            "eu-central",
            "eu-north",
            "eu-west",
        ]
        with pytest.raises(UnavailableError, match=r"an earlier push to eu-central .*k2 refused"):
            await asyncio.wait_for(third, timeout=5)
        assert sync._settled == {}  # every push ended: nothing kept
        await sync.close()


async def test_close_ends_every_push_still_running(tmp_path: Path) -> None:
    # Pushes that never answer, two writes deep (the second's pushes wait behind the
    # first's): close() must cancel and wait for every one of them, not only for what
    # an answered write left behind, so no push outlives the channels it uses.
    started: list[str] = []
    ended: list[str] = []
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)

        async def push(region: str, _w: CommittedWrite, _v: Version, _deadline: float) -> str:
            started.append(region)
            try:
                await asyncio.Event().wait()  # no answer, ever
            finally:
                ended.append(region)
            return region

        sync._push = push  # type: ignore[method-assign]
        sync._reconciled[PLACEMENT.dataset] = 5
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        writes = [asyncio.create_task(sync.replicate(write(done))) for _ in range(2)]
        await until(lambda: len(started) == 4, 5, "four pushes under way")
        await asyncio.wait_for(sync.close(), timeout=5)
        assert sorted(ended) == sorted(started)
        for task in writes:
            with pytest.raises((asyncio.CancelledError, UnavailableError)):
                await asyncio.wait_for(task, timeout=5)


async def test_a_caught_up_replica_counts_again_while_pushes_keep_overlapping(
    tmp_path: Path,
) -> None:
    """k2's push to eu-central fails while k1's still runs; the catch-up then brings
    eu-central level. k3, pushed after that while k1's push still runs (under load some
    push always runs), counts eu-central once k1's ends: the healed failure is not
    carried on to every later push for as long as pushes overlap."""

    class Listed:
        async def address(self, region: str) -> str:
            return f"{region}.agent:7400"

        def forget(self, region: str) -> None:
            pass

    async def nothing_there(_address: str, _dataset: str) -> list[object]:
        return []

    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        gated = Gated(store)
        sync, gates, write_of = gated.sync, gated.gates, gated.write_of
        del sync._mark_behind  # the real one: a catch-up runs
        sync.peers = Listed()  # type: ignore[assignment]
        sync._listing = nothing_there  # type: ignore[method-assign,assignment]
        first = asyncio.create_task(sync.replicate(write_of("k1")))
        second = asyncio.create_task(sync.replicate(write_of("k2")))
        await until(lambda: len(gates) == 4, 5, "k1's and k2's pushes")
        gates[("k2", "eu-north")].set_result("eu-north")
        gates[("k2", "eu-central")].set_exception(UnavailableError("k2 refused (test)"))
        with pytest.raises(UnavailableError, match="k2 refused"):
            await asyncio.wait_for(second, timeout=5)
        lane = (gated.every.dataset, "eu-central")
        await until(lambda: sync._healed.get(lane, 0) >= 4, 10, "eu-central caught up")
        third = asyncio.create_task(sync.replicate(write_of("k3")))
        await until(lambda: len(gates) == 6, 5, "k3's pushes")
        for region in ("eu-central", "eu-north"):
            gates[("k3", region)].set_result(region)
            gates[("k1", region)].set_result(region)
        await asyncio.wait_for(first, timeout=5)
        regions = await asyncio.wait_for(third, timeout=5)
        assert sorted(regions) == ["eu-central", "eu-north", "eu-west"]
        await sync.close()


async def test_an_answer_older_than_the_push_or_a_collision_is_not_a_commit(
    tmp_path: Path,
) -> None:
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)
        pushed = Version.put(HLC(2000, 0, "eu-west"), 3, Digest.of(b"new"))
        older = Version.put(HLC(1000, 0, "eu-west"), 3, Digest.of(b"old"))
        other = Version.put(pushed.hlc, 3, Digest.of(b"bad"))  # a collision
        ds = PLACEMENT.dataset
        await sync._check_newer("eu-central", ds, "k", pushed, version_to_wire(pushed))
        with pytest.raises(UnavailableError, match="older version held"):
            await sync._check_newer("eu-central", ds, "k", pushed, version_to_wire(older))
        with pytest.raises(UnavailableError, match="same HLC, other bytes"):
            await sync._check_newer("eu-central", ds, "k", pushed, version_to_wire(other))
        # ... and no catch-up pushes it for ever: LWW keeps the replica's own.
        assert not _lacks(other, pushed) and _lacks(older, pushed) and _lacks(None, pushed)
        await sync.close()


async def test_a_failure_after_the_catch_ups_listing_is_not_healed(tmp_path: Path) -> None:
    """Only failures of pushes numbered up to a finished catch-up's listing are healed:
    one after it (the catch-up's snapshot may lack its version) still fails the pushes
    that overlap it."""
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        gated = Gated(store)
        sync, gates, write_of = gated.sync, gated.gates, gated.write_of
        lane = (gated.every.dataset, "eu-central")
        first = asyncio.create_task(sync.replicate(write_of("k1")))
        await until(lambda: len(gates) == 2, 5, "k1's pushes")
        listed = sync._push_seq  # a catch-up listed here, then ended caught up
        second = asyncio.create_task(sync.replicate(write_of("k2")))
        await until(lambda: len(gates) == 4, 5, "k2's pushes")
        sync._healed[lane] = listed
        gates[("k2", "eu-north")].set_result("eu-north")
        gates[("k2", "eu-central")].set_exception(UnavailableError("k2 refused (test)"))
        with pytest.raises(UnavailableError, match="k2 refused"):
            await asyncio.wait_for(second, timeout=5)
        third = asyncio.create_task(sync.replicate(write_of("k3")))
        await until(lambda: len(gates) == 6, 5, "k3's pushes")
        for region in ("eu-central", "eu-north"):
            gates[("k3", region)].set_result(region)
            gates[("k1", region)].set_result(region)
        await asyncio.wait_for(first, timeout=5)
        with pytest.raises(UnavailableError, match=r"an earlier push to eu-central .*k2 refused"):
            await asyncio.wait_for(third, timeout=5)
        await sync.close()
