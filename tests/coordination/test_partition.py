"""A controller cut off from etcd (Toxiproxy) steps down instead of acting, and comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from harness.ports import free_port

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.stack.etcd import EtcdCluster

from .helpers import publish_world, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

World = tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]


@dataclass
class Partitioned:
    """eu-west's controller, reaching etcd only through a Toxiproxy proxy; eu-central's
    directly; both running (TTL 2 s) on a published world."""

    toxi: ToxiproxyClient
    proxy: str
    west: RegionController
    own: Ownership


@asynccontextmanager
async def partitioned(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World, toxiproxy_url: str, name: str
) -> AsyncIterator[Partitioned]:
    toxi = ToxiproxyClient(toxiproxy_url, timeout_s=5)
    port = free_port()
    listen, proxy = f"127.0.0.1:{port}", f"{name}-{port}"
    await asyncio.to_thread(toxi.create_proxy, proxy, listen, etcd3.endpoints[0])
    source, journal, probe = world
    west_coord = EtcdCoordination([listen], timeout_s=1)
    central_coord = EtcdCoordination(etcd3.endpoints, timeout_s=3)
    try:  # from the proxy's creation on: whatever fails, the proxy is deleted
        await west_coord.connect()
        await central_coord.connect()
        await publish_world(coord, source)
        west = RegionController(
            west_coord, journal, probe, ControllerConfig("eu-west", "w", lease_ttl_s=2)
        )
        central = RegionController(
            central_coord, journal, probe, ControllerConfig("eu-central", "c", lease_ttl_s=2)
        )
        async with central, west:
            yield Partitioned(toxi, proxy, west, Ownership(coord))
    finally:
        await west_coord.close()
        await central_coord.close()
        await asyncio.to_thread(toxi.delete_proxy, proxy)


async def test_partitioned_owner_steps_down_and_its_datasets_move(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World, toxiproxy_url: str
) -> None:
    async with partitioned(coord, etcd3, world, toxiproxy_url, "coord-partition") as p:
        west, own = p.west, p.own
        assert await wait_until(lambda: _count(own, "eu-west", 6), 10)
        await asyncio.to_thread(p.toxi.disable, p.proxy)
        # eu-west cannot renew: it steps down within about a TTL and forgets
        # what it owned, while eu-central takes the automatic datasets.
        assert await wait_until(lambda: _true(not west.active.is_set()), 6)
        assert west.owned == {}
        assert await wait_until(lambda: _count(own, "eu-central", 5), 6)
        await asyncio.to_thread(p.toxi.enable, p.proxy)
        assert await wait_until(lambda: _true(west.active.is_set()), 10)
        # only what is still its own, once it has re-read its datasets
        assert await wait_until(lambda: _true(sorted(west.owned) == ["ckpt/manual"]), 5)


async def test_owner_whose_etcd_answers_are_lost_is_failed_over(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World, toxiproxy_url: str
) -> None:
    """A one-way partition: eu-west's requests reach etcd, the answers never come back.
    Its renewals would still restart its lease there, keeping its liveness key, and so
    its datasets, away from a failover for as long as the cut lasts; it steps down, and
    must stop renewing, so that its lease expires and eu-central takes its datasets."""
    async with partitioned(coord, etcd3, world, toxiproxy_url, "coord-one-way") as p:
        west, own = p.west, p.own
        assert await wait_until(lambda: _count(own, "eu-west", 6), 10)
        await asyncio.to_thread(p.toxi.add_timeout, p.proxy, 0, ("downstream",))
        assert await wait_until(lambda: _true(not west.active.is_set()), 6)
        assert await wait_until(lambda: _gone(coord, keys.alive("eu-west")), 8)
        assert await wait_until(lambda: _count(own, "eu-central", 5), 10)
        await asyncio.to_thread(p.toxi.remove_toxics, p.proxy)
        # The heal: its HTTP/2 connection is out of step; gRPC reconnects with backoff.
        assert await wait_until(lambda: _true(west.active.is_set()), 20)
        assert await wait_until(lambda: _true(sorted(west.owned) == ["ckpt/manual"]), 5)


async def _gone(coord: EtcdCoordination, key: str) -> bool:
    return await coord.get(key) is None


async def _count(own: Ownership, region: str, n: int) -> bool:
    return sum(1 for o in (await own.list()).values() if o.region == region) == n


async def _true(value: bool) -> bool:
    return value
