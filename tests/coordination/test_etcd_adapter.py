"""The etcd adapter against a real three-member cluster (issue 2, item 5 and its test)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from waiting import WaitTimeoutError, until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.errors import OperationTimeoutError, UnavailableError
from controlplane.ports.coordination import Cmp, Compare, EventType, Get, Put, Target
from controlplane.stack.etcd import EtcdCluster

from .lossy import AnswersLost

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


async def test_keepalive_whose_answers_are_lost_stops_renewing_after_the_first(
    coord: EtcdCoordination, etcd3: EtcdCluster
) -> None:
    """A renewal whose answer is lost still restarts the lease's TTL in etcd: one sent
    at every interval would keep the holder's keys alive while it counts itself lost
    (a region's liveness key, which other regions wait to see gone to fail it over)."""
    lossy = AnswersLost(etcd3.endpoints, timeout_s=1)
    await lossy.connect()
    try:
        lease = await lossy.grant(2)
        ka = lossy.keep_alive(lease)
        await coord.put("/meridian/test/one-way", b"v", lease=lease.id)
        lossy.cut = True
        async with asyncio.timeout(lease.ttl_s + 5):
            await ka.lost.wait()
        assert lossy.renewals <= 1  # the first unanswered one; then only looks
        await until(
            lambda: _gone(coord, "/meridian/test/one-way"), lease.ttl_s + 5, "the key to go"
        )
        await ka.stop()
    finally:
        await lossy.close()


class OneRenewalRefused(EtcdCoordination):
    """The first renewal after `refuse` is set fails at once, without reaching etcd (a
    member killed under a call); `renewed` counts the renewals answered after it."""

    refuse = False
    refused = False
    renewed = 0
    renewals = 0

    async def refresh(self, lease_id: int) -> int:
        if self.refuse and not self.refused:
            self.refused = True
            raise UnavailableError("the member asked is gone (test)")
        ttl = await super().refresh(lease_id)
        self.renewals += 1
        if self.refused:
            self.renewed += 1
        return ttl


async def test_keepalive_renews_again_after_one_failed_renewal(etcd3: EtcdCluster) -> None:
    """After one failed renewal the keepalive looks at the lease first: etcd answers its
    TTL in whole seconds rounded down, 0 with under a second left, which is a live lease
    to renew, not a lost one (TTL 3: the look comes about 2 s after the last renewal)."""
    coord = OneRenewalRefused(etcd3.endpoints, timeout_s=1)
    await coord.connect()
    try:
        lease = await coord.grant(3)
        ka = coord.keep_alive(lease)
        await until(lambda: coord.renewals >= 1, 5, "the keepalive's first renewal")
        coord.refuse = True  # the next one, about a second later, fails
        await until(
            lambda: ka.lost.is_set() or coord.renewed >= 2, 15, "two renewals after the failure"
        )
        assert not ka.lost.is_set()
        assert await coord.lease_ttl(lease.id) > 0
        await ka.stop()
    finally:
        await coord.close()


class RenewalHangs(EtcdCoordination):
    """While `hang`, a renewal never answers (nor times out: longer than any TTL here)."""

    hang = False

    async def refresh(self, lease_id: int) -> int:
        if self.hang:
            await asyncio.Event().wait()  # never set: only the keepalive's bound ends it
        return await super().refresh(lease_id)


async def test_keepalive_counts_a_lease_lost_at_its_expiry_while_a_call_hangs(
    etcd3: EtcdCluster,
) -> None:
    """A renewal (or a look) still unanswered when the lease expires as counted here
    must not keep the holder believing it holds the lease until the call gives up."""
    coord = RenewalHangs(etcd3.endpoints, timeout_s=30)
    await coord.connect()
    try:
        lease = await coord.grant(2)
        ka = coord.keep_alive(lease)
        coord.hang = True
        async with asyncio.timeout(lease.ttl_s + 3):  # a TTL after the last answer
            await ka.lost.wait()
        await ka.stop()
    finally:
        await coord.close()


async def _gone(coord: EtcdCoordination, key: str) -> bool:
    return await coord.get(key) is None
