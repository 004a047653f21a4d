"""`meridian agent serve` as a real process, against the stack's etcd and PostgreSQL:
start-up refusals, the registration's life, metrics, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from harness.agent_process import WORLD_REGIONS, AgentProcess
from harness.cli_schema import check_output
from harness.controllers import run_cli
from harness.ports import free_port
from waiting import WaitTimeoutError, until, until_sync

from agents.client import AgentClient, FetchSource
from agents.errors import ResidencyError
from agents.store.errors import TooLargeError
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.coordination.protocols import keys
from controlplane.domain.version import Verdict
from controlplane.errors import NotFoundError, UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration


def serve(
    env: dict[str, str], root: Path, *, region: str = "eu-west", timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `agent serve` to its exit (for the start-up refusals)."""
    proc = AgentProcess(region, root, env, root.parent / f"{root.name}.log")
    done = subprocess.run(
        proc.argv(),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return done


def errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_it_exits_with_one_sentence_when_etcd_is_unreachable(
    tmp_path: Path, world: dict[str, str]
) -> None:
    env = {**world, "MERIDIAN_ETCD": f"127.0.0.1:{free_port()}", "MERIDIAN_ETCD_TIMEOUT_S": "1"}
    done = serve(env, tmp_path / "root")
    assert done.returncode == 1
    [line] = errors(done)
    assert "etcd at 127.0.0.1:" in line and "unreachable" in line, done.stderr
    assert "Traceback" not in done.stderr


def test_it_exits_with_one_sentence_when_the_root_is_not_writable(
    tmp_path: Path, world: dict[str, str]
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    # Root ignores permission bits; an immutable folder refuses even root.
    subprocess.run(["chattr", "+i", str(root)], check=True)
    try:
        done = serve(world, root)
    finally:
        subprocess.run(["chattr", "-i", str(root)], check=True)
    assert done.returncode == 1
    assert errors(done) == [
        f"error: the store root {root} is not writable: Operation not permitted"
    ]
    assert os.listdir(root) == []


def test_it_exits_with_one_sentence_when_its_region_is_not_in_the_topology(
    tmp_path: Path, world: dict[str, str]
) -> None:
    done = serve(world, tmp_path / "root", region="ap-south")
    assert done.returncode == 1
    assert errors(done) == [
        "error: region 'ap-south' is not in the applied topology "
        "(it has: eu-central, eu-west, us-east)"
    ]
    # It never got as far as opening a store.
    assert not (tmp_path / "root" / "meta.db").exists()


async def registration(etcd: str, region: str, agent_id: str) -> dict[str, object] | None:
    coord = EtcdCoordination([etcd], timeout_s=5)
    await coord.connect()
    try:
        kv = await coord.get(keys.agent(region, agent_id))
        return None if kv is None else dict(json.loads(kv.value))
    finally:
        await coord.close()


async def test_it_is_registered_while_up_and_deregistered_by_sigterm(
    agent: AgentProcess, etcd_endpoint: str
) -> None:
    health = agent.wait_healthy()
    doc = await registration(etcd_endpoint, "eu-west", health.agent_id)
    assert doc is not None
    assert doc["endpoint"] == agent.address and doc["region"] == "eu-west"
    assert agent.stop() == 0
    assert await registration(etcd_endpoint, "eu-west", health.agent_id) is None
    assert agent.event("agent_deregistered") is not None
    # The same root is the same agent after a restart.
    agent.start()
    assert agent.wait_healthy().agent_id == health.agent_id


async def test_after_sigkill_the_registration_expires_with_its_lease(
    tmp_path: Path, world: dict[str, str], etcd_endpoint: str
) -> None:
    # Renewed every TTL / 3: at the kill the lease has 3 s or more left, so the check
    # right after it sees the registration still there even if this process is slow.
    proc = AgentProcess("eu-west", tmp_path / "r", world, tmp_path / "r.log", lease_ttl_s=5)
    proc.start()
    try:
        agent_id = proc.wait_healthy().agent_id
        assert await registration(etcd_endpoint, "eu-west", agent_id) is not None
        proc.kill()
        assert await registration(etcd_endpoint, "eu-west", agent_id) is not None

        async def gone() -> bool:
            return await registration(etcd_endpoint, "eu-west", agent_id) is None

        # Nothing deregistered it (a SIGKILL runs no shutdown): it goes when etcd expires
        # the lease, within its 5 s; the wait leaves a loaded etcd room for that.
        await until(gone, 20, what=f"the registration of {agent_id} to expire")
    finally:
        proc.stop()


async def test_metrics_serve_the_spec_names_and_follow_the_store(agent: AgentProcess) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://{agent.metrics_address}/metrics")).text
        for name in (
            "meridian_agent_objects",
            "meridian_agent_bytes_stored",
            "meridian_transfer_bytes_total",
            "meridian_transfer_seconds",
            "meridian_residency_refused_total",
            "meridian_stale_epoch_refused_total",
            "meridian_records_behind_seconds",
            "meridian_tombstones_expired_total",
        ):
            assert f"# TYPE {name} " in text, name
        assert "meridian_agent_objects 0.0" in text
        # The push series to every other region are there at zero before any push: a
        # rate sees only what a series gained after it was first scraped.
        for region, _ in WORLD_REGIONS:
            if region != agent.region:
                series = f'stage="queued",to_region="{region}"'
                assert f"meridian_critical_push_seconds_count{{{series}}} 0.0" in text, region
                count = f'meridian_critical_push_items_count{{to_region="{region}"}} 0.0'
                assert count in text, region
        async with AgentClient(agent.address) as client:

            async def data() -> AsyncIterator[bytes]:
                yield b"x" * 1000

            await client.put("corpus/m", "a", data())
        text = (await http.get(f"http://{agent.metrics_address}/metrics")).text
        assert "meridian_agent_objects 1.0" in text
        assert "meridian_agent_bytes_stored 1000.0" in text
        # The put's change event reaches Kafka (acks=all) through the outbox drain.

        async def published() -> bool:
            nonlocal text
            text = (await http.get(f"http://{agent.metrics_address}/metrics")).text
            return "meridian_outbox_published_total 1.0" in text

        with contextlib.suppress(WaitTimeoutError):  # the assertion shows the metrics
            await until(published, 10, what="the outbox to publish the put")
    assert "meridian_outbox_published_total 1.0" in text
    assert "meridian_outbox_pending 0.0" in text


async def test_a_delete_is_forgotten_once_it_outlived_the_tombstone_retention(
    tmp_path: Path, world: dict[str, str]
) -> None:
    env = {
        **world,
        "MERIDIAN_TOMBSTONE_RETENTION_S": "3",
        "MERIDIAN_TOMBSTONE_EXPIRY_INTERVAL_S": "0.2",
    }
    proc = AgentProcess("eu-west", tmp_path / "r", env, tmp_path / "r.log", metrics=True)
    proc.start()
    try:
        async with AgentClient(proc.address) as client:

            async def data() -> AsyncIterator[bytes]:
                yield b"a rotated log"

            await client.put("corpus/logs", "day-1", data())
            await client.put("corpus/logs", "day-2", data())
            await client.delete("corpus/logs", "day-1")
            listed = await client.list("corpus/logs", include_deleted=True)
            assert [o.key for o in listed] == ["day-1", "day-2"]  # the tombstone, kept

            async def forgotten() -> bool:
                listed = await client.list("corpus/logs", include_deleted=True)
                return [o.key for o in listed] == ["day-2"]

            await until(forgotten, 30, what="the tombstone of day-1 to expire")
        async with httpx.AsyncClient(timeout=10) as http:

            async def counted() -> bool:  # once its pass has ended
                text = (await http.get(f"http://{proc.metrics_address}/metrics")).text
                return "meridian_tombstones_expired_total 1.0" in text

            await until(counted, 10, what="the expiry counted")
    finally:
        proc.stop()


async def test_sigterm_during_a_large_put_leaves_no_partial_object_and_exits_0(
    tmp_path: Path, world: dict[str, str]
) -> None:
    proc = AgentProcess("eu-west", tmp_path / "r", world, tmp_path / "r.log", grace_s=0.5)
    proc.start()
    started = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        # 1 MiB every 20 ms: a put that would last minutes, cut by the stop.
        for i in range(10_000):
            yield bytes([i % 251]) * (1024 * 1024)
            if i == 8:
                started.set()
            await asyncio.sleep(0.02)  # the pace of the load, not a wait for anything

    try:
        async with AgentClient(proc.address) as client:
            put = asyncio.create_task(client.put("corpus/big", "ckpt.bin", slow()))
            await asyncio.wait_for(started.wait(), 30)
            status = await asyncio.to_thread(proc.stop)
            with pytest.raises(UnavailableError):
                await asyncio.wait_for(put, 30)
        assert status == 0
        assert proc.event("agent_shutdown_complete") is not None
        proc.start()
        async with AgentClient(proc.address) as client:
            with pytest.raises(NotFoundError):
                await client.stat("corpus/big", "ckpt.bin")
            assert (await client.health()).objects == 0
        assert os.listdir(tmp_path / "r" / "tmp") == []
        assert [f for _, _, files in os.walk(tmp_path / "r" / "objects") for f in files] == []
    finally:
        proc.stop()


async def test_transfers_are_served_a_fetch_copies_between_two_agents_within_residency(
    agent: AgentProcess, tmp_path: Path, world: dict[str, str]
) -> None:
    central = AgentProcess("eu-central", tmp_path / "c", world, tmp_path / "c.log")
    us = AgentProcess("us-east", tmp_path / "u", world, tmp_path / "u.log")
    central.start()
    us.start()
    data = os.urandom(3 * 1024 * 1024 + 17)

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(data), 1024 * 1024):
            yield data[at : at + 1024 * 1024]

    try:
        async with (
            AgentClient(agent.address) as west_client,
            AgentClient(central.address) as central_client,
            AgentClient(us.address) as us_client,
        ):
            version = await west_client.put("eu/weights", "w.bin", chunks())
            source = [FetchSource("eu-west", agent.address)]
            got = await central_client.fetch(
                "eu/weights", "w.bin", version, source, origin_region="eu-west"
            )
            assert got.outcome is Verdict.APPLY and got.source_region == "eu-west"
            held, content = await central_client.get_bytes("eu/weights", "w.bin")
            assert held == version and content == data
            # eu/* is EU-resident: the US agent refuses to take a copy.
            with pytest.raises(ResidencyError):
                await us_client.fetch(
                    "eu/weights", "w.bin", version, source, origin_region="eu-west"
                )
            with pytest.raises(NotFoundError):
                await us_client.stat("eu/weights", "w.bin")
        # Both agents' recorders ship their journals: the catalog knows both copies, and
        # `object ls` at eu-west names both regions.
        hlc = str(version.hlc)
        catalog = open_catalog(world["MERIDIAN_CATALOG"])
        try:
            with contextlib.suppress(WaitTimeoutError):  # the assertion shows the holders
                await until(
                    lambda: (
                        catalog.holders("eu/weights", "w.bin", hlc) == ["eu-central", "eu-west"]
                    ),
                    15,
                    what="the catalog to know both copies",
                )
            assert catalog.holders("eu/weights", "w.bin", hlc) == ["eu-central", "eu-west"]
        finally:
            catalog.close()
        done = await asyncio.to_thread(
            run_cli,
            ["object", "ls", "--dataset", "eu/weights", "-o", "json"],
            {**world, "MERIDIAN_AGENT": agent.address},
        )
        assert done.returncode == 0, done.stderr
        [row] = json.loads(done.stdout)
        assert row["regions"] == ["eu-central", "eu-west"]
        assert done.stderr == ""
    finally:
        central.stop()
        us.stop()


def test_it_serves_while_the_catalog_and_kafka_are_down(
    tmp_path: Path, world: dict[str, str]
) -> None:
    """Neither is on the data path: writes commit, records wait in the store."""
    env = {
        **world,
        "MERIDIAN_CATALOG": f"postgresql+psycopg://meridian@127.0.0.1:{free_port()}/meridian",
        "MERIDIAN_KAFKA": f"127.0.0.1:{free_port()}",
    }
    proc = AgentProcess("eu-west", tmp_path / "r", env, tmp_path / "r.log")
    proc.start()
    try:
        small = tmp_path / "a.txt"
        small.write_bytes(b"written while the catalog and Kafka are down")
        done = run_cli(
            ["object", "put", "--dataset", "corpus/down", str(small), "-o", "json"],
            {**env, "MERIDIAN_AGENT": proc.address},
        )
        assert done.returncode == 0, done.stderr
        assert proc.event("catalog_unreachable_at_start") is not None
        assert proc.wait_event("kafka_unreachable", 30) is not None
        behind: list[object] = []

        def lagging() -> bool:
            # Its registration says how far behind its records are (dataplane.md,
            # Records): the put's record waits in its journal while the catalog is down.
            shown = run_cli(["region", "show", "eu-west", "-o", "json"], env)
            assert shown.returncode == 0, shown.stderr
            check_output("region_show", json.loads(shown.stdout))
            behind[:] = [a["records_behind_s"] for a in json.loads(shown.stdout)["agents"]]
            return bool(behind) and isinstance(behind[0], float) and behind[0] >= 1

        until_sync(
            lagging, 30, "the agent to publish its records' lag", step_s=1.0, detail=lambda: behind
        )
    finally:
        assert proc.stop() == 0


async def test_a_put_over_the_cap_is_refused(tmp_path: Path, world: dict[str, str]) -> None:
    proc = AgentProcess(
        "eu-west",
        tmp_path / "capped",
        world,
        tmp_path / "capped.log",
        extra_args=["--max-object-bytes", "300000"],
    )
    proc.start()
    try:
        async with AgentClient(proc.address) as client:
            with pytest.raises(TooLargeError, match="cap of 300000"):
                await client.put("corpus/a", "big", os.urandom(400_000))
            await client.put("corpus/a", "fits", os.urandom(200_000))
            with pytest.raises(NotFoundError):
                await client.stat("corpus/a", "big")
    finally:
        proc.stop()


async def test_a_stated_size_the_disk_cannot_take_is_refused_at_its_header(
    agent: AgentProcess,
) -> None:
    header = agent_pb2.PutHeader(dataset="corpus/a", key="huge", size=1 << 60)
    async with grpc.aio.insecure_channel(agent.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent_pb2_grpc.AgentStub(channel).Put(
                iter([agent_pb2.PutRequest(header=header)]), timeout=30
            )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "this agent's disk has" in str(err.value.details())
