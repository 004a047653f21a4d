"""Fixtures of the placement tests: a world on the stack's etcd (a SQLite catalog: these
tests need neither Kafka nor PostgreSQL) and a region of real agents, stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import prepare_world
from region_harness import RegionOfAgents

__all__ = ["region", "small_world"]


@pytest.fixture
def small_world(tmp_path: Path, etcd_endpoint: str) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    env = prepare_world(tmp_path / "world", etcd_endpoint)
    # Nobody drains the outboxes here (no Kafka): point the drain at a closed port.
    env["MERIDIAN_KAFKA"] = "127.0.0.1:1"
    yield env
    clear_keyspace(etcd_endpoint)


@pytest.fixture
def region(tmp_path: Path, small_world: dict[str, str]) -> Iterator[RegionOfAgents]:
    found = RegionOfAgents(tmp_path / "region", small_world)
    try:
        yield found
    finally:
        found.stop_all()
