"""Fixtures of the critical-dataset tests: the critical world (critical_helpers) on a
clean etcd keyspace, agent processes of its EU regions, and a connected etcd adapter
to claim owners with, as a controller would."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from critical_helpers import prepare_critical_world, running_agents
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess

from controlplane.adapters.etcd import EtcdCoordination


@pytest.fixture
def critical_world(tmp_path: Path, etcd_endpoint: str) -> dict[str, str]:
    clear_keyspace(etcd_endpoint)
    return prepare_critical_world(tmp_path / "world", etcd_endpoint)


@pytest.fixture
def eu_agents(tmp_path: Path, critical_world: dict[str, str]) -> Iterator[dict[str, AgentProcess]]:
    """One started agent per EU region (eu-west, eu-central, eu-north), stopped after."""
    with running_agents(tmp_path, critical_world) as procs:
        yield procs


@pytest.fixture
async def coord(
    etcd_endpoint: str, critical_world: dict[str, str]
) -> AsyncIterator[EtcdCoordination]:
    async with EtcdCoordination([etcd_endpoint], timeout_s=5.0) as c:
        yield c
