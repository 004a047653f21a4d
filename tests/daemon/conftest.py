"""Fixtures of the agent daemon's tests: etcd of the local stack on a clean keyspace, and
real agent processes (see harness.agent_fixtures)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from harness.agent_fixtures import agent, world

from controlplane.adapters.etcd import EtcdCoordination

__all__ = ["agent", "coord", "world"]


@pytest.fixture
async def coord(etcd_endpoint: str) -> AsyncIterator[EtcdCoordination]:
    """A connected adapter on a clean `/meridian/` keyspace (the stack's etcd is this
    suite's own: its port is the daemon engineer's)."""
    c = EtcdCoordination([etcd_endpoint], timeout_s=5.0)
    await c.connect()
    await c.delete("/meridian/", prefix=True)
    try:
        yield c
    finally:
        await c.delete("/meridian/", prefix=True)
        await c.close()
