"""Pytest fixtures for tests against real agent processes (imported by the conftest of
each test folder that needs them): a world (a fresh PostgreSQL catalog with the world
policy applied and published to the stack's etcd, on a clean keyspace, and the stack's
Kafka) and one agent of eu-west serving it, stopped after the test."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.adapters.etcd import EtcdCoordination
from harness.agent_process import AgentProcess, prepare_world
from harness.catalogs import scratch_postgres


@contextlib.asynccontextmanager
async def clean_coordination(endpoints: list[str]) -> AsyncIterator[EtcdCoordination]:
    """A connected etcd adapter on a clean `/meridian/` keyspace, cleared again after."""
    coord = EtcdCoordination(endpoints, timeout_s=5.0)
    await coord.connect()
    await coord.delete("/meridian/", prefix=True)
    try:
        yield coord
    finally:
        await coord.delete("/meridian/", prefix=True)
        await coord.close()


def clear_keyspace(etcd: str) -> None:
    """Delete every key under /meridian/ (each test gets its own world)."""

    async def clear() -> None:
        coord = EtcdCoordination([etcd], timeout_s=5.0)
        await coord.connect()
        try:
            await coord.delete("/meridian/", prefix=True)
        finally:
            await coord.close()

    # In a thread of its own: asyncio.run here would replace the session's event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, clear()).result(timeout=30)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    etcd_endpoint: str,
    postgres_url: str,
    kafka_bootstrap: str,
) -> Iterator[dict[str, str]]:
    """The environment of `meridian` for a fresh world (see the module docstring), one per
    test module: applying a policy through the CLI takes seconds, and each agent of a
    test has a root of its own."""
    clear_keyspace(etcd_endpoint)
    folder = tmp_path_factory.mktemp("world")
    with scratch_postgres(postgres_url, prefix="meridian_agent") as url:
        yield prepare_world(folder, etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
def agent(tmp_path: Path, world: dict[str, str]) -> Iterator[AgentProcess]:
    """An agent of eu-west on a fresh root, with metrics, serving `world`."""
    proc = AgentProcess(
        "eu-west", tmp_path / "eu-west", world, tmp_path / "eu-west.log", metrics=True
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
