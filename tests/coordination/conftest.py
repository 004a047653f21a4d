"""Fixtures of the coordination tests: a private three-member etcd cluster and helpers.

The cluster uses ports 32379/32389/32399 (peers 32380/32390/32400), or the next free
block of 100 above, so that it never collides with the stack's etcd on 2379. It is
started once per session with the stack's own code (`start_etcd_cluster`); a missing
etcd binary is a failure.
"""

from __future__ import annotations

import shutil
import socket
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from harness.agent_fixtures import clean_coordination
from harness.controllers import ControllerProcess

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.stack.etcd import EtcdCluster, start_etcd_cluster

from .helpers import REGIONS, critical

CLIENT_PORT = 32379


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base() -> int:
    """The first base port (32379, 32479, ...) whose six cluster ports are all free, so
    two runs of this suite on one machine (a developer's and CI's) do not collide."""
    for base in range(CLIENT_PORT, CLIENT_PORT + 2000, 100):
        if all(_free(base + 10 * i + d) for i in range(3) for d in (0, 1)):
            return base
    raise RuntimeError("no free ports for a three-member etcd cluster above 32379")


@pytest.fixture(scope="session")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    base = tmp_path_factory.mktemp("etcd3")
    with warnings.catch_warnings():
        # The stack launcher drops its Popen handles on purpose (the members outlive
        # it, tracked by pid files); Popen.__del__ then warns that they still run.
        warnings.simplefilter("ignore", ResourceWarning)
        port = free_base()
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
