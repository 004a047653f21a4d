"""Catalog fixtures on SQLite and PostgreSQL, and a private real etcd.

The etcd is private (not the stack's) because `policy apply` writes
`/meridian/policy/current`, which the region controllers of other tests watch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.catalog_fixtures import catalog_url, empty_catalog_url

from controlplane.loopback import free_block
from controlplane.stack.etcd import start_etcd_cluster

__all__ = ["catalog_url", "empty_catalog_url", "private_etcd"]


@pytest.fixture(scope="module")
def private_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a one-member etcd started for this module, stopped after it."""
    # Client and peer port, below the ephemeral range (controlplane/loopback.py).
    port = free_block((0, 1))
    cluster = start_etcd_cluster(
        tmp_path_factory.mktemp("etcd"), members=1, client_port=port, peer_port=port + 1
    )
    try:
        yield cluster.endpoints[0].removeprefix("http://")
    finally:
        cluster.stop()
