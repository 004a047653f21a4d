"""Fixtures of the placement tests: a world on the stack's etcd (a SQLite catalog: these
tests need neither Kafka nor PostgreSQL), one per module since applying the policy
through the CLI takes seconds, and a region of real agents per test, killed after it
with their registrations, votes and holdings removed (the next test's region starts empty)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import prepare_world
from region_harness import RegionOfAgents, clear_prefix

from agents.placement.departures import roster_of
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.holdings import HOLDINGS

__all__ = ["region", "small_world"]


@pytest.fixture(scope="module")
def small_world(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    env = prepare_world(tmp_path_factory.mktemp("world"), etcd_endpoint)
    # Nobody drains the outboxes here (no Kafka): point the drain at a closed port.
    env["MERIDIAN_KAFKA"] = "127.0.0.1:1"
    yield env
    clear_keyspace(etcd_endpoint)


@pytest.fixture
def region(tmp_path: Path, small_world: dict[str, str]) -> Iterator[RegionOfAgents]:
    found = RegionOfAgents(tmp_path / "region", dict(small_world))
    try:
        yield found
    finally:
        found.stop_all()
        # What the killed agents left on their leases (up to 30 s in a test) goes now,
        # not into the next test: registrations, fast-fail votes and holdings records, and
        # the killed agents' roster entries (no lease: they would refuse the next test's
        # complete listings, agents/placement/departures.py).
        for prefix in (
            keys.agents_of(found.region),
            f"{keys.FAST_FAIL}{found.region}/",
            HOLDINGS,
            roster_of(found.region),
        ):
            clear_prefix(small_world["MERIDIAN_ETCD"], prefix)
