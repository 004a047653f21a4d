"""The etcd protocols unit-tested on the in-memory fake, without etcd.

What the fake is for: ownership, handover marks on a lease, fencing through
`follow_ownership` and fenced locks run on it unchanged, fast and deterministic
(a `ManualClock` decides when leases expire).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from fakes.coordination import ManualClock, MemoryCoordination

from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.follow import follow_ownership
from controlplane.coordination.protocols.locks import GlobalLock, HeldLock, LockLostError
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import (
    ConflictError,
    OperationTimeoutError,
    UnavailableError,
    WatchCompactedError,
)
from controlplane.ports.coordination import WatchEvent

from .helpers import wait_until


async def _verdict(resource: FencedResource, dataset: str, epoch: int) -> str:
    try:
        resource.admit(dataset, epoch)
    except DatasetHandingOverError:
        return "frozen"
    except StaleEpochError:
        return "stale"
    return "admitted"


async def test_claims_race_to_one_winner_and_a_handover_on_a_lease_lapses_with_it() -> None:
    clock = ManualClock()
    coord = MemoryCoordination(clock)
    own = Ownership(coord)

    async def claim(region: str) -> int | None:
        try:
            return await own.claim("ckpt/x", region, expect_epoch=0, reason="t", actor="t")
        except ConflictError:
            return None

    winners = [e for e in await asyncio.gather(*map(claim, "abcde")) if e is not None]
    assert len(winners) == 1
    owner = await own.get("ckpt/x")
    assert owner is not None and owner.epoch == winners[0]
    resource = FencedResource()
    ready = asyncio.Event()
    follower = asyncio.create_task(follow_ownership(coord, resource, ready))
    try:
        await asyncio.wait_for(ready.wait(), 5)
        lease = await coord.grant(3)
        mark = await own.begin_handover("ckpt/x", owner, "b", "runbook", lease=lease.id)
        assert mark.lease == lease.id
        epoch = owner.epoch
        assert await wait_until(lambda: _is(resource, epoch, "frozen"), 2)
        clock.advance(2.9)  # the runbook is dead: nobody renews
        assert await _verdict(resource, "ckpt/x", epoch) == "frozen"
        clock.advance(0.2)  # ...and its lease lapses: the mark goes, writes resume
        assert await wait_until(lambda: _is(resource, epoch, "admitted"), 2)
        assert await own.handover("ckpt/x") is None
        await coord.put(keys.alive("b"), b"{}")
        with pytest.raises(ConflictError):  # the lapsed mark cannot be completed
            await own.complete_handover(mark, reason="t", actor="t")
        moved = await own.claim("ckpt/x", "b", expect_epoch=owner.epoch, reason="t", actor="t")
        assert await wait_until(lambda: _is(resource, epoch, "stale"), 2)
        assert await _verdict(resource, "ckpt/x", moved) == "admitted"
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await coord.close()


async def _is(resource: FencedResource, epoch: int, want: str) -> bool:
    return await _verdict(resource, "ckpt/x", epoch) == want


async def test_fenced_lock_on_the_fake_hands_out_growing_tokens() -> None:
    coord = MemoryCoordination()
    lock = GlobalLock(coord, "t", ttl_s=5)
    async with lock.hold() as first:
        with pytest.raises(OperationTimeoutError):
            async with GlobalLock(coord, "t", ttl_s=5).hold(timeout_s=0.2):
                pass
    async with lock.hold() as second:
        assert second.token > first.token
    await coord.close()


class BrokenWatches(MemoryCoordination):
    """Breaks the next `broken` watches of one exact key (as compaction or a
    non-transient gRPC error would), counting every watch of it."""

    def __init__(self, key_prefix: str) -> None:
        super().__init__()
        self.key_prefix, self.broken, self.watched = key_prefix, 0, 0

    async def watch(  # type: ignore[override]
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        if not prefix and key.startswith(self.key_prefix):
            self.watched += 1
            if self.broken:
                self.broken -= 1
                raise WatchCompactedError(f"the watch on {key} was compacted (test)")
        async for ev in super().watch(key, prefix=prefix, start_revision=start_revision):
            yield ev


async def test_a_broken_watch_on_a_held_lock_is_not_a_lost_lock() -> None:
    """Only the key's deletion (or finding it gone) loses the lock: a watch that breaks
    is re-established, and the holder keeps running (no spurious step-down)."""
    coord = BrokenWatches(keys.LOCKS)
    holder_done = asyncio.Event()
    outcome: list[BaseException | None] = []

    async def hold() -> None:
        try:
            async with GlobalLock(coord, "t", ttl_s=5).hold() as held:
                holding.set_result(held)
                await asyncio.Event().wait()
        except BaseException as exc:  # noqa: BLE001 - what ended the holder is asserted
            outcome.append(exc)
        finally:
            holder_done.set()

    holding: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    coord.broken = 2
    task = asyncio.create_task(hold())
    held = await asyncio.wait_for(holding, 5)
    assert await wait_until(lambda: _true(coord.watched >= 3), 10)  # broken twice, back
    assert not held.lost.is_set() and not task.done()  # type: ignore[attr-defined]
    await coord.delete(held.key)  # type: ignore[attr-defined]
    await asyncio.wait_for(holder_done.wait(), 10)
    assert held.lost.is_set()  # type: ignore[attr-defined]
    assert outcome and "lost" in str(outcome[0])
    await coord.close()


class WedgedWatches(MemoryCoordination):
    """Watches of one key prefix that never say anything and never fail (a stream
    wedged without an error), counted; every other watch as the fake's."""

    def __init__(self, key_prefix: str) -> None:
        super().__init__()
        self.key_prefix, self.watched = key_prefix, 0

    async def watch(  # type: ignore[override]
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        if key.startswith(self.key_prefix):
            self.watched += 1
            await asyncio.Event().wait()
        async for ev in super().watch(key, prefix=prefix, start_revision=start_revision):
            yield ev


async def test_a_waiter_behind_a_wedged_watch_is_granted_once_the_key_ahead_goes() -> None:
    """A waiter watches the key ahead of it; a watch that goes silent without an error
    would keep it waiting for ever after that key is gone (no standby takes over).
    It reads the keys again every `recheck_s`, so it is granted within that."""
    coord = WedgedWatches(keys.lock("t"))
    first = GlobalLock(coord, "t", ttl_s=5)
    second = GlobalLock(coord, "t", ttl_s=5, recheck_s=0.05)
    async with first.hold() as held:
        waiting = asyncio.create_task(_hold_briefly(second))
        assert await wait_until(lambda: _true(coord.watched >= 3), 5)  # silent, re-read
        assert not waiting.done()  # still behind a key that is there
    token = await asyncio.wait_for(waiting, 5)  # released: seen by a re-read
    assert token > held.token
    await coord.close()


async def test_a_held_lock_behind_a_wedged_watch_is_lost_when_its_key_is_deleted() -> None:
    """The holder watches its own key for an operator's delete; a silent watch is
    looked behind every `recheck_s`, so the delete still ends the hold."""
    coord = WedgedWatches(keys.lock("t"))
    lost = asyncio.Event()

    async def hold() -> None:
        with contextlib.suppress(LockLostError):
            async with GlobalLock(coord, "t", ttl_s=5, recheck_s=0.05).hold() as held:
                holding.set_result(held)
                await asyncio.Event().wait()
        lost.set()

    holding: asyncio.Future[HeldLock] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(hold())
    held = await asyncio.wait_for(holding, 5)
    assert await wait_until(lambda: _true(coord.watched >= 2), 5)
    assert not held.lost.is_set()  # its key is there: silence is not a loss
    await coord.delete(held.key)
    await asyncio.wait_for(lost.wait(), 5)
    assert held.lost.is_set()
    await task
    await coord.close()


async def _hold_briefly(lock: GlobalLock) -> int:
    async with lock.hold(timeout_s=10) as held:
        return held.token


async def _true(value: bool) -> bool:
    return value


async def _lose_in_an_outage(
    coord: MemoryCoordination, clock: ManualClock, lock: GlobalLock, *, etcd_keeps_it: bool
) -> HeldLock:
    """Hold `lock`, then cut etcd off until the keepalive gives up (after a TTL); with
    `etcd_keeps_it`, etcd expires nothing meanwhile, as in a quorum loss."""
    holding: asyncio.Future[HeldLock] = asyncio.get_running_loop().create_future()
    ended: list[BaseException] = []

    async def hold() -> None:
        try:
            async with lock.hold() as held:
                holding.set_result(held)
                await asyncio.Event().wait()
        except LockLostError as exc:
            ended.append(exc)

    task = asyncio.create_task(hold())
    held = await asyncio.wait_for(holding, 5)
    coord.set_unavailable(True)
    if etcd_keeps_it:
        coord.extend_leases(60)
    clock.advance(lock.ttl_s)  # the keepalive's next try fails a TTL after its last answer
    await asyncio.wait_for(task, 5)
    assert ended and held.lost.is_set()
    return held


async def test_a_lock_lost_in_an_outage_etcd_outlived_is_held_again_under_its_lease() -> None:
    """A quorum loss outlasts the keepalive, not the lease (etcd expires nothing without
    quorum): the next hold renews the same lease, so the key and token never change."""
    clock = ManualClock()
    coord = MemoryCoordination(clock)
    lock = GlobalLock(coord, "t", ttl_s=3)
    first = await _lose_in_an_outage(coord, clock, lock, etcd_keeps_it=True)
    with pytest.raises(UnavailableError):  # still out: the lease is asked about next time
        async with lock.hold():
            pass
    coord.set_unavailable(False)
    assert (await coord.get(first.key)) is not None  # nothing vanished meanwhile
    async with lock.hold(timeout_s=5) as again:  # a new lease would queue behind the old
        assert again.resumed
        assert (again.lease.id, again.key, again.token) == (first.lease.id, first.key, first.token)
    assert await coord.lease_ttl(first.lease.id) == -1  # a clean release revokes it
    async with lock.hold() as third:
        assert not third.resumed and third.token > first.token
    await coord.close()


async def _outage_over(
    coord: MemoryCoordination, *, etcd_keeps_it: bool
) -> tuple[GlobalLock, HeldLock]:
    """A lock held on `coord` (a ManualClock's), lost in an outage that is now over."""
    assert isinstance(coord.clock, ManualClock)
    lock = GlobalLock(coord, "t", ttl_s=3)
    first = await _lose_in_an_outage(coord, coord.clock, lock, etcd_keeps_it=etcd_keeps_it)
    coord.set_unavailable(False)
    return lock, first


async def test_a_lock_whose_lease_expired_in_the_outage_is_taken_anew() -> None:
    coord = MemoryCoordination(ManualClock())
    lock, first = await _outage_over(coord, etcd_keeps_it=False)
    assert (await coord.get(first.key)) is None  # the lease expired with its key
    async with lock.hold() as again:
        assert not again.resumed
        assert again.lease.id != first.lease.id and again.token > first.token
    await coord.close()


async def test_a_kept_lease_whose_key_an_operator_deleted_is_not_a_resume() -> None:
    coord = MemoryCoordination(ManualClock())
    lock, first = await _outage_over(coord, etcd_keeps_it=True)
    await coord.delete(first.key)  # the operator, while nobody held the lock
    async with lock.hold(timeout_s=5) as again:
        assert again.lease.id == first.lease.id  # the lease lived on
        assert not again.resumed and again.token > first.token  # a new hold under it
    await coord.close()


def _holder(
    lock: GlobalLock, grants: list[str], name: str, tasks: list[asyncio.Task[None]]
) -> asyncio.Future[HeldLock]:
    """Hold `lock` in a task (added to `tasks`) until cancelled: its grant, once granted
    (or the error that ended the hold before that)."""
    granted: asyncio.Future[HeldLock] = asyncio.get_running_loop().create_future()

    async def hold() -> None:
        try:
            async with lock.hold(timeout_s=30) as held:
                grants.append(name)
                granted.set_result(held)
                await asyncio.Event().wait()
        except Exception as exc:  # noqa: BLE001 - handed to the test through the future
            if not granted.done():
                granted.set_exception(exc)

    tasks.append(asyncio.create_task(hold()))
    return granted


@pytest.mark.parametrize("first_try_fails", [False, True])
async def test_a_holder_back_from_a_lost_hold_queues_behind_a_waiter(
    first_try_fails: bool,
) -> None:
    """A holder that loses its hold by its own count while etcd keeps its lease (an
    outage, or a process that stalls for about a TTL) must not take its key up first
    in line again while another waits: stalling again and again, it would keep a
    healthy standby out for good. Its lease stays, and what lives under it. A try that
    fails before its key moved (an etcd call) leaves the next try to move it."""
    clock = ManualClock()
    coord = TxnFailsOnce(clock)
    a, b = GlobalLock(coord, "t", ttl_s=3), GlobalLock(coord, "t", ttl_s=3)
    grants: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    first = await _holder(a, grants, "a", tasks)
    alive = "/t-alive"  # a region's liveness key lives under its controller's lease
    await coord.put(alive, b"a", lease=first.lease.id)
    waiting = _holder(b, grants, "b", tasks)
    assert await wait_until(lambda: _true(len(_order(coord)) == 2), 5)  # b queued
    coord.set_unavailable(True)  # the outage ends b's wait and, after a TTL, a's hold
    coord.extend_leases(60)
    clock.advance(a.ttl_s)
    with pytest.raises(UnavailableError):
        await asyncio.wait_for(waiting, 5)
    assert await wait_until(lambda: _true(first.lost.is_set()), 5)
    coord.set_unavailable(False)

    if first_try_fails:
        coord.fail_next = True
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(_holder(a, grants, "a", tasks), 5)
        assert _order(coord)[0] == first.key  # not moved yet
    # a comes back first, finds b's kept key and goes behind it; b takes its own up,
    # still first in line (a waiter keeps its place).
    a_again = _holder(a, grants, "a", tasks)
    assert await wait_until(lambda: _true(_order(coord)[-1] == first.key), 5)
    assert (await coord.get(alive)) is not None  # a's lease lived on: nothing vanished
    second = await asyncio.wait_for(_holder(b, grants, "b", tasks), 5)
    assert second.resumed and not a_again.done()
    assert grants == ["a", "b"]
    assert (await coord.get(alive)) is not None
    await coord.delete(second.key)  # b's hold ends: a is next, under its old lease
    again = await asyncio.wait_for(a_again, 5)
    assert again.lease.id == first.lease.id and not again.resumed
    assert again.token > second.token > first.token
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await coord.close()


def _order(coord: MemoryCoordination) -> list[str]:
    """The lock's keys, first in line first."""
    kvs = [kv for k, kv in coord._data.items() if k.startswith(keys.lock("t"))]
    return [kv.key for kv in sorted(kvs, key=lambda kv: kv.create_revision)]


class AnswersLost(MemoryCoordination):
    """Calls reach the store, their answers do not come back (a one-way partition):
    a look at a lease fails before reaching it, a renewal reaches it and then fails."""

    lost = False
    renewals = 0

    async def lease_ttl(self, lease_id: int) -> int:
        if self.lost:
            raise UnavailableError("etcd did not answer the TTL read (test)")
        return await super().lease_ttl(lease_id)

    async def refresh(self, lease_id: int) -> int:
        self.renewals += 1
        ttl = await super().refresh(lease_id)  # etcd renewed it...
        if self.lost:
            raise UnavailableError("etcd's answer to the renewal was lost (test)")
        return ttl


async def test_a_kept_lease_is_looked_at_before_it_is_renewed() -> None:
    """A holder whose answers are lost must not renew its kept lease at every try: each
    renewal reaches etcd and keeps the keys of a holder that stepped down alive."""
    clock = ManualClock()
    coord = AnswersLost(clock)
    lock, first = await _outage_over(coord, etcd_keeps_it=True)
    coord.lost, coord.renewals = True, 0
    for _ in range(3):
        with pytest.raises(UnavailableError):
            async with lock.hold():
                pass
    assert coord.renewals == 0
    coord.lost = False
    async with lock.hold(timeout_s=5) as again:  # answered again: renewed and resumed
        assert again.resumed and again.token == first.token
    assert coord.renewals >= 1
    await coord.close()


async def test_a_kept_lease_with_under_a_second_left_is_resumed() -> None:
    """etcd gives a lease's TTL in whole seconds, rounded down: 0 is a live lease. A new
    lease granted beside it would queue behind the holder's own old key, and the old
    lease's keys (a region's liveness key) would vanish with it: a death to others."""
    clock = ManualClock()
    coord = MemoryCoordination(clock)
    lock, first = await _outage_over(coord, etcd_keeps_it=True)
    clock.advance(coord._leases[first.lease.id].expires_at - clock() - 0.5)
    assert await coord.lease_ttl(first.lease.id) == 0
    async with lock.hold(timeout_s=5) as again:
        assert again.resumed and again.lease.id == first.lease.id
    await coord.close()


class TxnFailsOnce(MemoryCoordination):
    """Fails the next transaction, as an etcd that just came back may."""

    fail_next = False

    async def txn(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        if self.fail_next:
            self.fail_next = False
            raise UnavailableError("etcd did not answer the transaction (test)")
        return await super().txn(*args, **kwargs)  # type: ignore[arg-type]


async def test_a_kept_lease_survives_a_failed_call_and_is_revoked_when_abandoned() -> None:
    clock = ManualClock()
    coord = TxnFailsOnce(clock)
    lock, first = await _outage_over(coord, etcd_keeps_it=True)
    coord.fail_next = True
    with pytest.raises(UnavailableError):  # taken up, then an etcd call failed
        async with lock.hold():
            pass
    assert (await coord.get(first.key)) is not None  # not revoked: kept for the next hold
    async with lock.hold(timeout_s=5) as again:
        assert again.resumed and again.token == first.token
    # Kept again after a second outage, then abandoned: revoked, its key gone at once.
    second = await _lose_in_an_outage(coord, clock, lock, etcd_keeps_it=True)
    coord.set_unavailable(False)
    await lock.abandon()
    assert await coord.lease_ttl(second.lease.id) == -1
    assert (await coord.get(second.key)) is None
    await coord.close()


async def test_one_unreadable_handover_mark_freezes_its_dataset_alone() -> None:
    # The failover watch, claims and runbooks all read the view: one bad mark must not
    # make every read fail (no failover anywhere); its dataset stays frozen.
    from controlplane.coordination.protocols.ownership import UNREADABLE_MARK
    from controlplane.coordination.protocols.view import read_view

    coord = MemoryCoordination(ManualClock())
    own = Ownership(coord)
    for ds in ("ckpt/x", "ckpt/y"):
        await own.claim(ds, "eu-west", expect_epoch=0, reason="seed", actor="test")
    await coord.put(keys.handover("ckpt/x"), b"{}")
    view = await read_view(coord)
    assert view.owners["ckpt/x"].handing_over_to == UNREADABLE_MARK
    assert view.owners["ckpt/y"].handing_over_to is None
    assert view.owners["ckpt/y"].region == "eu-west"
    listed = await own.list()  # `dataset list` reads them too
    assert listed["ckpt/x"].handing_over_to == UNREADABLE_MARK
    assert listed["ckpt/y"].handing_over_to is None


async def test_one_unreadable_owner_record_stops_no_read_of_every_owner() -> None:
    # A value Meridian did not write (an operator's `etcdctl put`, another release):
    # the failover watch, claims, the journal and runbooks all read every owner, so it
    # must not make those reads fail (no failover anywhere); its dataset is left out.
    from controlplane.coordination.protocols.ownership import CorruptRecordError
    from controlplane.coordination.protocols.view import read_view

    coord = MemoryCoordination(ManualClock())
    own = Ownership(coord)
    await own.claim("ckpt/y", "eu-west", expect_epoch=0, reason="seed", actor="test")
    start = await coord.revision()
    await coord.put(keys.owner("ckpt/x"), b'{"not": "an owner"}')
    view = await read_view(coord)
    assert set(view.owners) == {"ckpt/y"}
    assert set(await own.list()) == {"ckpt/y"}
    with pytest.raises(CorruptRecordError, match="ckpt/x"):
        await own.get("ckpt/x")  # asked for by name: one clear error
    await own.claim("ckpt/z", "eu-west", expect_epoch=0, reason="seed", actor="test")
    seen: list[str] = []
    async for ds, _ in own.watch(start_revision=start + 1):  # the bad one is skipped
        seen.append(ds)
        break
    assert seen == ["ckpt/z"]
