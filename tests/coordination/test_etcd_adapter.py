"""The etcd adapter against a real three-member cluster (issue 2, item 5 and its test)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from waiting import WaitTimeoutError, until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import OperationTimeoutError, UnavailableError
from controlplane.ports.coordination import Cmp, Compare, EventType, Get, Put, Target

pytestmark = pytest.mark.integration


async def test_key_on_lease_disappears_with_its_lease_after_keepalive_stops(
    coord: EtcdCoordination,
) -> None:
    lease = await coord.grant(2)
    await coord.put("/meridian/test/leased", b"v", lease=lease.id)
    ka = coord.keep_alive(lease)
    await asyncio.sleep(3)  # longer than the TTL: only the keepalive keeps it
    assert await coord.get("/meridian/test/leased") is not None
    assert not ka.lost.is_set()
    await ka.stop()

    async def gone() -> bool:
        return await coord.get("/meridian/test/leased") is None

    with contextlib.suppress(WaitTimeoutError):  # the assertion says it is still there
        # Within the TTL, then etcd's expiry pass (every 0.5 s) through the 3-member
        # cluster; the rest is room for a loaded machine.
        await until(gone, lease.ttl_s + 5, "the leased key to go with its lease")
    assert await coord.get("/meridian/test/leased") is None
    assert await coord.lease_ttl(lease.id) == -1
    assert await coord.refresh(lease.id) <= 0


async def test_txn_compares_mod_revision_and_returns_reads(coord: EtcdCoordination) -> None:
    rev = await coord.put("/meridian/test/k", b"1")
    ok = await coord.txn(
        [Compare("/meridian/test/k", Target.MOD, Cmp.EQUAL, rev)],
        [Put("/meridian/test/k", b"2"), Get("/meridian/test/", prefix=True)],
    )
    assert ok.succeeded and ok.revision > rev
    assert [kv.value for kv in ok.reads[0]] == [b"2"]
    stale = await coord.txn(
        [Compare("/meridian/test/k", Target.MOD, Cmp.EQUAL, rev)], [Put("/meridian/test/k", b"3")]
    )
    assert not stale.succeeded
    kv = await coord.get("/meridian/test/k")
    assert kv is not None and kv.value == b"2"


async def test_watch_sees_puts_and_deletes_in_order(coord: EtcdCoordination) -> None:
    start = await coord.revision()
    await coord.put("/meridian/test/w/a", b"1")
    await coord.put("/meridian/test/w/b", b"2")
    await coord.delete("/meridian/test/w/a")
    seen: list[tuple[EventType, str]] = []

    async def collect() -> None:
        async for ev in coord.watch("/meridian/test/w/", prefix=True, start_revision=start + 1):
            seen.append((ev.type, ev.kv.key))
            if len(seen) == 3:
                return

    await asyncio.wait_for(collect(), 5)
    assert seen == [
        (EventType.PUT, "/meridian/test/w/a"),
        (EventType.PUT, "/meridian/test/w/b"),
        (EventType.DELETE, "/meridian/test/w/a"),
    ]


async def test_revoke_deletes_keys_and_unknown_lease_is_harmless(coord: EtcdCoordination) -> None:
    lease = await coord.grant(30)
    await coord.put("/meridian/test/r", b"v", lease=lease.id)
    await coord.revoke(lease.id)
    assert await coord.get("/meridian/test/r") is None
    await coord.revoke(lease.id)  # second revoke: not an error


async def test_unreachable_etcd_is_one_retriable_error() -> None:
    c = EtcdCoordination(["127.0.0.1:1"], timeout_s=0.5)
    with pytest.raises(UnavailableError) as info:
        await c.connect()
    assert info.value.retriable
    assert "127.0.0.1:1" in str(info.value)
    assert isinstance(info.value, UnavailableError | OperationTimeoutError)
