"""The coordination port's contract, asserted alike on the in-memory fake and on etcd.

Each test takes `store`: `tests/fakes/coordination.MemoryCoordination`, or the etcd
adapter on the private three-member cluster. A difference between the two is a
bug in one of them (the fake is what unit tests of future appliers and agents
will trust).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from fakes.coordination import ManualClock, MemoryCoordination
from harness.agent_fixtures import clean_coordination

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import NotFoundError, UnavailableError, WatchCompactedError
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Coordination,
    Delete,
    EventType,
    Get,
    Put,
    Target,
    WatchEvent,
)
from controlplane.stack.etcd import EtcdCluster

K = "/meridian/test/"


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.integration)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Coordination]:
    if request.param == "memory":
        mem = MemoryCoordination()
        try:
            yield mem
        finally:
            await mem.close()
    else:
        # The session's private cluster (a sync fixture; an async one cannot be asked
        # for from here), on a clean keyspace as the `coord` fixture gives it.
        cluster: EtcdCluster = request.getfixturevalue("etcd3")
        async with clean_coordination(cluster.endpoints) as etcd:
            yield etcd


async def _events(
    store: Coordination,
    key: str,
    start: int,
    count: int,
    *,
    prefix: bool = True,
    timeout_s: float = 5,
) -> list[WatchEvent]:
    out: list[WatchEvent] = []

    async def collect() -> None:
        async for ev in store.watch(key, prefix=prefix, start_revision=start):
            out.append(ev)
            if len(out) == count:
                return

    await asyncio.wait_for(collect(), timeout_s)
    return out


async def test_revisions_grow_once_per_write_and_keys_carry_them(store: Coordination) -> None:
    r0 = await store.revision()
    r1 = await store.put(K + "a", b"1")
    assert r1 == r0 + 1
    r2 = await store.put(K + "a", b"2")
    kv = await store.get(K + "a")
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"2", r1, r2, 2)
    await store.put(K + "c", b"3")
    await store.put(K + "b", b"4")
    kvs, at = await store.get_prefix(K)
    assert [k.key for k in kvs] == [K + "a", K + "b", K + "c"]
    assert at == await store.revision() == r2 + 2
    assert await store.get(K + "missing") is None


async def test_deleting_nothing_or_reading_in_a_txn_does_not_bump_the_revision(
    store: Coordination,
) -> None:
    await store.put(K + "x", b"1")
    await store.put(K + "y", b"1")
    before = await store.revision()
    assert await store.delete(K + "nothing") == 0
    res = await store.txn([], [Get(K, prefix=True)])
    assert res.succeeded and res.revision == before == await store.revision()
    assert await store.delete(K, prefix=True) == 2
    assert await store.revision() == before + 1  # one request, one revision


async def test_txn_is_compare_and_set_at_one_revision_with_its_own_reads(
    store: Coordination,
) -> None:
    absent = Compare(K + "own", Target.CREATE, Cmp.EQUAL, 0)
    first = await store.txn(
        [absent], [Put(K + "own", b"a"), Put(K + "other", b"b"), Get(K, prefix=True)]
    )
    assert first.succeeded
    assert [(kv.key, kv.mod_revision) for kv in first.reads[0]] == [
        (K + "other", first.revision),
        (K + "own", first.revision),
    ]
    again = await store.txn([absent], [Put(K + "own", b"z")], [Get(K + "own")])
    assert not again.succeeded and again.revision == first.revision
    assert [kv.value for kv in again.reads[0]] == [b"a"]
    moved = await store.txn(
        [Compare(K + "own", Target.MOD, Cmp.EQUAL, first.revision)],
        [Put(K + "own", b"c"), Delete(K + "other")],
    )
    assert moved.succeeded and moved.revision == first.revision + 1
    assert await store.get(K + "other") is None
    guards = [
        Compare(K + "own", Target.VALUE, Cmp.EQUAL, b"c"),
        Compare(K + "own", Target.VERSION, Cmp.GREATER, 1),
        Compare(K + "own", Target.CREATE, Cmp.LESS, moved.revision),
    ]
    assert (await store.txn(guards, [])).succeeded
    # A VALUE compare on a missing key is false, even "not equal".
    missing = Compare(K + "none", Target.VALUE, Cmp.NOT_EQUAL, b"q")
    assert not (await store.txn([missing], [])).succeeded


async def test_leased_keys_go_with_their_lease(store: Coordination) -> None:
    lease = await store.grant(30)
    await store.put(K + "l1", b"v", lease=lease.id)
    res = await store.txn([], [Put(K + "l2", b"v", lease.id)])
    kv = await store.get(K + "l1")
    assert kv is not None and kv.lease == lease.id
    assert 0 < await store.lease_ttl(lease.id) <= 30
    assert await store.refresh(lease.id) > 0
    start = res.revision + 1
    await store.revoke(lease.id)
    events = await _events(store, K, start, 2)
    assert {(e.type, e.kv.key) for e in events} == {
        (EventType.DELETE, K + "l1"),
        (EventType.DELETE, K + "l2"),
    }
    assert await store.get(K + "l1") is None and await store.get(K + "l2") is None
    assert await store.lease_ttl(lease.id) == -1
    assert await store.refresh(lease.id) == -1
    await store.revoke(lease.id)  # revoking a gone lease is not an error
    with pytest.raises(NotFoundError):
        await store.put(K + "l3", b"v", lease=lease.id)


async def test_a_lease_expires_without_renewal_and_lives_on_with_a_keepalive(
    store: Coordination,
) -> None:
    kept, left = await store.grant(2), await store.grant(2)
    await store.put(K + "kept", b"v", lease=kept.id)
    rev = await store.put(K + "left", b"v", lease=left.id)
    ka = store.keep_alive(kept)
    granted = time.monotonic()
    # etcd expires a lease in a pass every 0.5 s, through its cluster: past the TTL on a
    # quiet machine, and seconds more on a loaded one; a lease that never lapses fails.
    expiry_s = left.ttl_s + 5
    [gone] = await _events(store, K + "left", rev + 1, 1, prefix=False, timeout_s=expiry_s)
    assert gone.type is EventType.DELETE
    assert time.monotonic() - granted <= expiry_s
    assert await store.get(K + "kept") is not None and not ka.lost.is_set()
    await store.revoke(kept.id)
    await asyncio.wait_for(ka.lost.wait(), 5)  # the keepalive notices the lease is gone
    await ka.stop()


async def test_watch_replays_from_its_start_revision_in_order(store: Coordination) -> None:
    start = await store.revision() + 1
    await store.put(K + "w/a", b"1")
    both = await store.txn([], [Put(K + "w/b", b"2"), Put(K + "w/c", b"3")])
    await store.delete(K + "w/a")
    await store.put(K + "elsewhere", b"x")
    events = await _events(store, K + "w/", start, 4)
    assert [(e.type, e.kv.key) for e in events] == [
        (EventType.PUT, K + "w/a"),
        (EventType.PUT, K + "w/b"),
        (EventType.PUT, K + "w/c"),
        (EventType.DELETE, K + "w/a"),
    ]
    assert events[1].revision == events[2].revision == both.revision
    assert events[3].revision == both.revision + 1 and events[3].kv.value == b""
    # start_revision 0: only what happens after the watch began.
    seen: list[WatchEvent] = []
    ready = asyncio.Event()

    async def from_now() -> None:
        stream = store.watch(K + "w/", prefix=True)
        ready.set()
        async for ev in stream:
            seen.append(ev)
            return

    task = asyncio.create_task(from_now())
    await asyncio.wait_for(ready.wait(), 5)
    for attempt in range(50):  # the etcd watch is registered asynchronously: retry the put
        await store.put(K + "w/new", str(attempt).encode())
        done, _ = await asyncio.wait([task], timeout=0.1)
        if done:
            break
    await asyncio.wait_for(task, 5)
    assert [e.kv.key for e in seen] == [K + "w/new"]


async def test_a_closed_store_refuses_calls(store: Coordination) -> None:
    if isinstance(store, EtcdCoordination):
        own: Coordination = EtcdCoordination(store.endpoints, timeout_s=5.0)
        await own.__aenter__()
    else:
        own = MemoryCoordination()
    await own.put(K + "c", b"v")
    await own.close()
    await own.close()  # idempotent
    with pytest.raises(UnavailableError):
        await own.get(K + "c")


# -- fake only: what etcd offers but the port does not reach ------------------


async def test_fake_outage_is_retriable_and_ends() -> None:
    mem = MemoryCoordination()
    await mem.put(K + "o", b"v")
    mem.set_unavailable(True)
    with pytest.raises(UnavailableError) as info:
        await mem.get(K + "o")
    assert info.value.retriable
    mem.set_unavailable(False)
    assert await mem.get(K + "o") is not None
    await mem.close()


async def test_fake_watch_waits_out_an_outage() -> None:
    """As the adapter's watch does across a broken stream (test_watch_resume.py)."""
    mem = MemoryCoordination()
    start = await mem.put(K + "q0", b"0")
    seen: list[str] = []
    more = asyncio.Event()

    async def follow() -> None:
        async for ev in mem.watch(K, prefix=True, start_revision=start):
            seen.append(ev.kv.key)
            more.set()
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(more.wait(), 5)
    mem.set_unavailable(True)
    for _ in range(5):  # let the watch meet the outage: it waits, it does not end
        await asyncio.sleep(0)
    assert not task.done() and seen == [K + "q0"]
    mem.set_unavailable(False)
    await mem.put(K + "q1", b"1")
    await mem.put(K + "q2", b"2")
    await asyncio.wait_for(task, 5)
    assert seen == [K + "q0", K + "q1", K + "q2"]
    await mem.close()


async def test_fake_watch_lagging_behind_a_compaction_raises() -> None:
    mem = MemoryCoordination()
    start = await mem.put(K + "c0", b"0")
    watch = mem.watch(K, prefix=True, start_revision=start)
    first = await anext(watch)
    assert first.kv.key == K + "c0"
    await mem.put(K + "c1", b"1")
    last = await mem.put(K + "c2", b"2")
    mem.compact(last)
    with pytest.raises(WatchCompactedError, match="compacted"):
        await anext(watch)
    await watch.aclose()
    await mem.close()


async def test_get_at_a_revision_reads_the_keys_past(store: Coordination) -> None:
    """A key as it was at a revision (the journal duty reads a displaced owner record
    so); a revision compacted away is NotFoundError, not a silent None."""
    first = await store.put(K + "h", b"1")
    second = await store.put(K + "h", b"2")
    await store.delete(K + "h")
    gone = await store.revision()
    await store.put(K + "other", b"x")
    before = first - 1
    assert await store.get(K + "h", revision=before) is None
    old = await store.get(K + "h", revision=first)
    assert old is not None and (old.value, old.mod_revision) == (b"1", first)
    new = await store.get(K + "h", revision=second)
    assert new is not None and new.value == b"2"
    assert await store.get(K + "h", revision=gone) is None
    assert await store.get(K + "h") is None
    if isinstance(store, MemoryCoordination):
        store.compact(second)
    else:
        assert isinstance(store, EtcdCoordination)
        await store._client.kv.compact(second)  # the port does not compact: the client does
    with pytest.raises(NotFoundError, match="revision"):
        await store.get(K + "h", revision=first)


async def test_fake_compaction_refuses_an_older_watch() -> None:
    mem = MemoryCoordination()
    await mem.put(K + "a", b"1")
    rev = await mem.put(K + "a", b"2")
    mem.compact(rev)
    with pytest.raises(WatchCompactedError):
        async for _ in mem.watch(K + "a", start_revision=rev - 1):
            break
    [ev] = await _events(mem, K + "a", rev, 1, prefix=False)
    assert ev.kv.value == b"2"
    await mem.close()


async def test_fake_manual_clock_expires_leases_only_when_advanced() -> None:
    clock = ManualClock()
    mem = MemoryCoordination(clock)
    lease = await mem.grant(5)
    await mem.put(K + "m", b"v", lease=lease.id)
    clock.advance(4.9)
    # Alive with 0.1 s left, which etcd (and so the fake) reads as a TTL of 0: whole
    # seconds, rounded down.
    assert await mem.get(K + "m") is not None and await mem.lease_ttl(lease.id) == 0
    clock.advance(0.2)
    assert await mem.get(K + "m") is None and await mem.lease_ttl(lease.id) == -1
    await mem.close()


async def test_fake_keepalive_reports_loss_after_an_outage_longer_than_its_ttl() -> None:
    mem = MemoryCoordination()
    lease = await mem.grant(1)
    ka = mem.keep_alive(lease)
    mem.set_unavailable(True)  # no renewal gets through, as in an etcd outage
    await asyncio.wait_for(ka.lost.wait(), 5)
    mem.set_unavailable(False)
    assert await mem.lease_ttl(lease.id) == -1  # and the store expired it meanwhile
    await ka.stop()
    await mem.close()
