"""The etcd look-ups of the critical write path, made cheaper without losing freshness
(issue 13's benchmark): a replica's owner read before it commits a pushed copy is
shared by concurrent pushes but is always a read begun after the push asked
(`EtcdOwners.read_fresh`); the owner reuses a replica agent's address for a bounded
time and forgets it when a push fails (`EtcdPeers`). Units on the in-memory port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
from fakes.coordination import MemoryCoordination
from waiting import until

from agents.owners import EtcdOwners
from agents.replication.peers import EtcdPeers
from agents.replication.sync import _check_region
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import UnavailableError
from controlplane.ports.coordination import Compare, Get, Op, TxnResult

DATASET = "tri/lookups"


class HeldReads(MemoryCoordination):
    """Counts the read-only transactions (an owner read); while `hold` is clear such a
    read has looked at etcd but does not answer yet (a read under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.hold = asyncio.Event()
        self.hold.set()

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        result = await super().txn(compares, success, failure)
        if not compares and all(isinstance(op, Get) for op in success):
            self.reads += 1
            await asyncio.wait_for(self.hold.wait(), timeout=5)
        return result


async def test_concurrent_fresh_reads_share_one_etcd_read() -> None:
    coord = HeldReads()
    epoch = await Ownership(coord).claim(DATASET, "eu-west", expect_epoch=0, reason="t", actor="t")
    owners = EtcdOwners(coord, FencedResource())
    before = coord.reads  # (the claim reads too)
    found = await asyncio.gather(*(owners.read_fresh(DATASET) for _ in range(20)))
    assert {r.record.epoch for r in found if r.record} == {epoch}
    assert coord.reads - before == 1


async def test_a_fresh_read_never_joins_a_read_already_under_way() -> None:
    """A push that arrives while a read is in flight waits for the next one: the read
    under way may have looked at etcd before a failover committed."""
    coord = HeldReads()
    ownership = Ownership(coord)
    first = await ownership.claim(DATASET, "eu-west", expect_epoch=0, reason="t", actor="t")
    owners = EtcdOwners(coord, FencedResource())
    before = coord.reads  # (the claim reads too)
    coord.hold.clear()
    early = asyncio.create_task(owners.read_fresh(DATASET))
    await until(lambda: coord.reads > before, timeout_s=5, what="the first read under way")
    # Failed over after that read looked at etcd, before it answered.
    second = await ownership.claim(DATASET, "eu-north", expect_epoch=first, reason="t", actor="t")
    late = asyncio.create_task(owners.read_fresh(DATASET))
    coord.hold.set()
    old, new = await early, await late
    assert old.record is not None and old.record.epoch == first
    assert new.record is not None and (new.record.region, new.record.epoch) == ("eu-north", second)
    assert coord.reads - before == 2


async def test_a_failed_fresh_read_fails_every_waiter_and_the_next_reads_again() -> None:
    coord = HeldReads()
    await Ownership(coord).claim(DATASET, "eu-west", expect_epoch=0, reason="t", actor="t")
    owners = EtcdOwners(coord, FencedResource())
    coord.set_unavailable(True)
    got = await asyncio.gather(
        *(owners.read_fresh(DATASET) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(g, UnavailableError) for g in got), got
    coord.set_unavailable(False)
    again = await owners.read_fresh(DATASET)
    assert again.record is not None and again.record.region == "eu-west"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def register(coord: MemoryCoordination, region: str, endpoint: str) -> None:
    await coord.put(keys.agent(region, f"{region}-a"), json.dumps({"endpoint": endpoint}).encode())


async def test_a_peer_address_is_reused_for_its_age_and_read_again_once_forgotten() -> None:
    coord = MemoryCoordination()
    clock = Clock()
    peers = EtcdPeers(coord, max_age_s=1.0, clock=clock)
    await register(coord, "eu-central", "127.0.0.1:20001")
    assert await peers.address("eu-central") == "127.0.0.1:20001"
    await register(coord, "eu-central", "127.0.0.1:20002")  # the agent came back elsewhere
    clock.now += 0.5
    assert await peers.address("eu-central") == "127.0.0.1:20001"  # within its age
    peers.forget("eu-central")  # a push to it failed
    assert await peers.address("eu-central") == "127.0.0.1:20002"
    await register(coord, "eu-central", "127.0.0.1:20003")
    clock.now += 1.5
    assert await peers.address("eu-central") == "127.0.0.1:20003"  # aged out


async def test_without_an_age_every_address_is_read_from_etcd() -> None:
    coord = MemoryCoordination()
    peers = EtcdPeers(coord)
    await register(coord, "eu-central", "127.0.0.1:20001")
    assert await peers.address("eu-central") == "127.0.0.1:20001"
    await register(coord, "eu-central", "127.0.0.1:20002")
    assert await peers.address("eu-central") == "127.0.0.1:20002"


def test_a_copy_answered_by_another_regions_agent_is_not_counted() -> None:
    _check_region("", "eu-central", "127.0.0.1:1")  # an agent that does not say: as before
    _check_region("eu-central", "eu-central", "127.0.0.1:1")
    with pytest.raises(UnavailableError, match="not of eu-central"):
        _check_region("eu-north", "eu-central", "127.0.0.1:1")
