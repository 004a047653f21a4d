"""Catalog fixtures on SQLite and PostgreSQL, and a private real etcd.

The etcd is private (not the stack's) because `policy apply` writes
`/meridian/policy/current`, which the region controllers of other tests watch.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from harness.catalog_fixtures import catalog_url, empty_catalog_url

from controlplane.stack.etcd import start_etcd_cluster

__all__ = ["catalog_url", "empty_catalog_url", "private_etcd"]


def _free_port_pair() -> int:
    """A port p with p and p+1 free right now (client and peer port)."""
    for _ in range(50):  # bounded: free pairs are common on loopback
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with socket.socket() as peer:
            try:
                peer.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


@pytest.fixture(scope="module")
def private_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a one-member etcd started for this module, stopped after it."""
    port = _free_port_pair()
    cluster = start_etcd_cluster(
        tmp_path_factory.mktemp("etcd"), members=1, client_port=port, peer_port=port + 1
    )
    try:
        yield cluster.endpoints[0].removeprefix("http://")
    finally:
        cluster.stop()
