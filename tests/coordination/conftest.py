"""Fixtures of the coordination tests: a private three-member etcd cluster and helpers.

The cluster uses ports 32379/32389/32399 (peers 32380/32390/32400) so that it never
collides with the stack's etcd on 2379. It is started once per session with the
stack's own code (`start_etcd_cluster`); a missing etcd binary is a failure.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.sources import MemoryCatchUp, MemoryJournal, MemoryPlacements
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster

from .helpers import REGIONS, critical

CLIENT_PORT = 32379
PEER_PORT = 32380


@pytest.fixture(scope="session")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    base = tmp_path_factory.mktemp("etcd3")
    with warnings.catch_warnings():
        # The stack launcher drops its Popen handles on purpose (the members outlive
        # it, tracked by pid files); Popen.__del__ then warns that they still run.
        warnings.simplefilter("ignore", ResourceWarning)
        cluster = start_etcd_cluster(base, members=3, client_port=CLIENT_PORT, peer_port=PEER_PORT)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def coord(etcd3: EtcdCluster) -> AsyncIterator[EtcdCoordination]:
    """A connected adapter on a clean `/meridian/` keyspace."""
    c = EtcdCoordination(etcd3.endpoints, timeout_s=5.0)
    await c.connect()
    await c.delete("/meridian/", prefix=True)
    try:
        yield c
    finally:
        await c.delete("/meridian/", prefix=True)
        await c.close()


@pytest.fixture
def world() -> tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]:
    placements = [critical(f"ckpt/m{i}") for i in range(5)]
    placements.append(critical("ckpt/manual", mode="manual"))
    return MemoryPlacements(REGIONS, placements), MemoryJournal(), MemoryCatchUp()


@pytest.fixture
def fence_dir(tmp_path: Path) -> Path:
    return tmp_path / "fence"
