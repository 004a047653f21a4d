"""End to end with real processes: two regions' agents (`meridian agent serve`, their
outbox drained to the stack's Kafka, their recorders shipping to the catalog) and a
`meridian replicator run` of eu-central. A standard object written in eu-west appears
in eu-central (a small one inline, a large one fetched from eu-west by the agent); a
delete propagates; the lag gauge returns to 0. The replicator, started without
--agent, applies through the region's next agent once the first one is gone."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess, prepare_world
from harness.catalogs import scratch_postgres
from harness.ports import free_port
from repl_world import ReplicatorProcess
from waiting import until

from agents.client import AgentClient
from controlplane.domain.version import Version
from controlplane.errors import NotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def world(
    tmp_path: Path, etcd_endpoint: str, postgres_url: str, kafka_bootstrap: str
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    with scratch_postgres(postgres_url, prefix="meridian_repl") as url:
        yield prepare_world(tmp_path / "world", etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
async def agents(tmp_path: Path, world: dict[str, str]) -> AsyncIterator[dict[str, AgentProcess]]:
    procs = {
        r: AgentProcess(r, tmp_path / r, world, tmp_path / f"{r}.log")
        for r in ("eu-west", "eu-central")
    }
    try:
        for p in procs.values():
            await asyncio.to_thread(p.start)
        yield procs
    finally:
        for p in procs.values():
            await asyncio.to_thread(p.stop)


async def held(client: AgentClient, dataset: str, key: str) -> Version | None:
    try:
        return (await client.stat(dataset, key)).version
    except NotFoundError:
        return None


async def newest(client: AgentClient, dataset: str, key: str) -> Version | None:
    """The newest version held, a tombstone included (Stat hides a deleted object)."""
    found = [o.version for o in await client.list(dataset, include_deleted=True) if o.key == key]
    return found[0] if found else None


async def eventually(probe: object, want: object, timeout_s: float = 90) -> None:
    """Poll another process (an agent over gRPC) until `probe()` gives `want`, bounded."""
    got = None

    async def given() -> bool:
        nonlocal got
        got = await probe()  # type: ignore[operator]
        return bool(got == want)

    await until(given, timeout_s, f"{want!r}", step_s=0.2, detail=lambda: got)


def lag_of(metrics: str, dataset: str) -> float | None:
    pattern = (
        r'meridian_replication_lag_seconds\{dataset="'
        + re.escape(dataset)
        + r'",region="eu-central"\} ([0-9.e+-]+)'
    )
    found = re.search(pattern, metrics)
    return None if found is None else float(found.group(1))


async def test_a_write_in_one_region_appears_in_the_other_and_a_delete_follows(
    world: dict[str, str], agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    port = free_port()
    repl = ReplicatorProcess(
        "eu-central",
        None,  # spec/cli.md's `replicator run --region R`: eu-central's agent, from etcd
        world,
        tmp_path / "repl",
        metrics_addr=f"127.0.0.1:{port}",
    )
    repl.start()
    ds = f"corpus/e2e-{uuid.uuid4().hex[:8]}"
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 4096)  # 1 MiB: above inline_max_bytes, fetched
    try:
        await repl.wait_log("replicator_started")
        assert agents["eu-central"].address in repl.log()  # the one it found and applies through
        async with (
            AgentClient(agents["eu-west"].address) as west,
            AgentClient(agents["eu-central"].address) as central,
        ):
            small = await west.put(ds, "small.txt", _chunks(b"hello from eu-west"))
            large = await west.put(ds, "big.bin", big)
            await eventually(lambda: held(central, ds, "small.txt"), small)
            await eventually(lambda: held(central, ds, "big.bin"), large)
            _version, data = await central.get_bytes(ds, "big.bin")
            assert data == big.read_bytes()
            gone = await west.delete(ds, "small.txt")
            await eventually(lambda: newest(central, ds, "small.txt"), gone)  # the tombstone
            assert await held(central, ds, "small.txt") is None

            async def lag() -> float | None:
                async with httpx.AsyncClient() as http:
                    text = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
                return lag_of(text, ds)

            await eventually(lag, 0.0)

        # The agent it found stops for good and another takes the region's place: the
        # replicator applies through the new one (replicator/agent_follow.py).
        await asyncio.to_thread(agents["eu-central"].stop)
        successor = AgentProcess(
            "eu-central", tmp_path / "eu-central-2", world, tmp_path / "eu-central-2.log"
        )
        agents["eu-central-2"] = successor
        await asyncio.to_thread(successor.start)
        await repl.wait_log("replicator_agent_replaced")
        assert successor.address in repl.log()
        async with (
            AgentClient(agents["eu-west"].address) as west,
            AgentClient(successor.address) as central,
        ):
            after = await west.put(ds, "after.txt", _chunks(b"written after the move"))
            await eventually(lambda: held(central, ds, "after.txt"), after)
    finally:
        code = repl.terminate()
    assert code == 0, repl.log()[-3000:]


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data
