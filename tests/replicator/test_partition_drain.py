"""A destination region partitioned, then healed, with real processes: agents of eu-west
and eu-central (their outboxes to the stack's Kafka, their recorders to the catalog)
and eu-central's `meridian replicator run`, which reaches Kafka only through the
stack's WAN proxy (Toxiproxy). While the proxy is down the origin keeps accepting
writes and the backlog shows in the replicator's `meridian_replication_pending` and
`_lag_seconds` (read from the catalog, not from Kafka); after the heal it drains to 0
and every object is in eu-central."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
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
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.domain.version import Version
from controlplane.errors import NotFoundError
from controlplane.settings import Settings
from controlplane.stack.kafka import wan_proxy_port
from controlplane.stack.manager import KAFKA_WAN_PROXY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGION = "eu-central"


@pytest.fixture
def world(
    tmp_path: Path, etcd_endpoint: str, postgres_url: str, kafka_bootstrap: str
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    with scratch_postgres(postgres_url, prefix="meridian_repl_cut") as url:
        yield prepare_world(tmp_path / "world", etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
async def agents(tmp_path: Path, world: dict[str, str]) -> AsyncIterator[dict[str, AgentProcess]]:
    procs = {
        r: AgentProcess(r, tmp_path / r, world, tmp_path / f"{r}.log") for r in ("eu-west", REGION)
    }
    try:
        await asyncio.gather(*(asyncio.to_thread(p.start, 90) for p in procs.values()))
        yield procs
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs.values()))


@pytest.fixture
def faults(toxiproxy_url: str) -> Iterator[ToxiproxyClient]:
    client = ToxiproxyClient(toxiproxy_url)
    yield client
    client.enable(KAFKA_WAN_PROXY)  # whatever the test did, the link is up again


def gauge(text: str, name: str, dataset: str) -> float | None:
    found = re.search(
        rf'{name}\{{dataset="{re.escape(dataset)}",region="{REGION}"\}} ([0-9.e+-]+)', text
    )
    return None if found is None else float(found.group(1))


async def held(client: AgentClient, dataset: str, key: str) -> Version | None:
    try:
        return (await client.stat(dataset, key)).version
    except NotFoundError:
        return None


async def test_a_partitioned_region_shows_its_backlog_and_drains_after_heal(
    tmp_path: Path,
    world: dict[str, str],
    agents: dict[str, AgentProcess],
    faults: ToxiproxyClient,
    stack_settings: Settings,
) -> None:
    port = free_port()
    wan = f"127.0.0.1:{wan_proxy_port(stack_settings)}"
    repl = ReplicatorProcess(
        REGION,
        agents[REGION].address,
        {**world, "MERIDIAN_KAFKA": wan},  # this region reads the log over the "WAN"
        tmp_path / "repl",
        metrics_addr=f"127.0.0.1:{port}",
    )
    repl.start()
    ds = f"corpus/cut-{uuid.uuid4().hex[:8]}"

    async def metrics() -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text

    async def body(data: bytes) -> AsyncIterator[bytes]:
        yield data

    try:
        await repl.wait_log("replicator_started", 90)
        async with (
            AgentClient(agents["eu-west"].address) as west,
            AgentClient(agents[REGION].address) as central,
        ):
            first = await west.put(ds, "before", body(b"before the cut"))
            await until(
                lambda: _is(held(central, ds, "before"), first), 90, "replicated", step_s=0.3
            )

            faults.disable(KAFKA_WAN_PROXY)
            cut = {
                f"during-{i}": await west.put(ds, f"during-{i}", body(b"x%d" % i))
                for i in range(20)
            }

            async def backlog_shown() -> bool:
                text = await metrics()
                pending = gauge(text, "meridian_replication_pending", ds)
                lag = gauge(text, "meridian_replication_lag_seconds", ds)
                return pending == len(cut) and lag is not None and lag > 0

            await until(backlog_shown, 60, "showing the backlog", step_s=0.3)
            assert all([await held(central, ds, k) is None for k in cut])  # nothing arrived

            faults.enable(KAFKA_WAN_PROXY)

            async def drained() -> bool:
                text = await metrics()
                return (
                    gauge(text, "meridian_replication_pending", ds) == 0
                    and gauge(text, "meridian_replication_lag_seconds", ds) == 0
                )

            await until(drained, 120, "drained", step_s=0.3)
            for key, version in cut.items():
                assert await held(central, ds, key) == version
    finally:
        code = repl.terminate()
    assert code == 0, repl.log()[-3000:]


async def _is(got: Awaitable[Version | None], want: Version) -> bool:
    return await got == want
