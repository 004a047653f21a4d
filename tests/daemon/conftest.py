"""Fixtures of the agent daemon's tests: etcd of the local stack on a clean keyspace, and
real agent processes (see harness.agent_fixtures)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from harness.agent_fixtures import agent, clean_coordination, world

from controlplane.adapters.etcd import EtcdCoordination

__all__ = ["agent", "coord", "world"]


@pytest.fixture
async def coord(etcd_endpoint: str) -> AsyncIterator[EtcdCoordination]:
    """A connected adapter on a clean `/meridian/` keyspace (the stack's etcd is this
    suite's own: its port is the daemon engineer's)."""
    async with clean_coordination([etcd_endpoint]) as c:
        yield c
