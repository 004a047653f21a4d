"""Fixtures of the coordination tests: a private three-member etcd cluster and helpers.

The cluster's members listen on base, base + 10 and base + 20 (peers one above each),
with a base below the ephemeral range (`controlplane.loopback.free_block`), so that it
collides neither with the stack's etcd on 2379 nor with another run of the suite. It is
started once per session with the stack's own code (`start_etcd_cluster`); a missing
etcd binary is a failure.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from harness.agent_fixtures import clean_coordination
from harness.controllers import ControllerProcess

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.loopback import free_block
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster

from .helpers import REGIONS, critical

CLUSTER_OFFSETS = (0, 1, 10, 11, 20, 21)  # client and peer port of each of 3 members


@pytest.fixture(scope="session")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    base = tmp_path_factory.mktemp("etcd3")
    port = free_block(CLUSTER_OFFSETS)
    cluster = start_etcd_cluster(base, members=3, client_port=port, peer_port=port + 1)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def coord(etcd3: EtcdCluster) -> AsyncIterator[EtcdCoordination]:
    """A connected adapter on a clean `/meridian/` keyspace."""
    async with clean_coordination(etcd3.endpoints) as c:
        yield c


@pytest.fixture
def world() -> tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]:
    placements = [critical(f"ckpt/m{i}") for i in range(5)]
    placements.append(critical("ckpt/manual", mode="manual"))
    return MemoryPlacements(REGIONS, placements), MemoryJournal(), MemoryCatchUp()


@pytest.fixture
def fence_dir(tmp_path: Path) -> Path:
    return tmp_path / "fence"


@pytest.fixture
def procs() -> Iterator[list[ControllerProcess]]:
    """Controller processes a test starts (it appends them), stopped after it."""
    started: list[ControllerProcess] = []
    yield started
    for p in started:
        p.stop()
