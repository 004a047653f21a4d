"""A PostgreSQL outage does not take the control plane down (issue 9, section 2).

Four real `meridian controller run` processes on the stack's real PostgreSQL and
the private three-member etcd. PostgreSQL gets a fast shutdown (SIGINT to the
postmaster, as an operator's `pg_ctl -m fast` would) for longer than two lease
TTLs; during the outage eu-west's controller is SIGKILLed, then restarted. The
controllers keep their leases, the restarted one takes its region's again,
nothing moves but eu-west's automatic datasets, those do move, and their
journal rows reach the catalog once it is back. Prints how long the outage and
the journal catch-up took.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from harness.controllers import ControllerProcess, apply_world, policy_yaml
from harness.invariants import epoch_violations
from sqlalchemy.engine import make_url
from waiting import until_sync

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.coordination.catalog_glue.sources import JournalEntry
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.settings import load_settings
from controlplane.stack.etcd import EtcdCluster
from controlplane.stack.manager import Stack
from controlplane.stack.postgres import PostgresService

from .helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TTL = 5  # a keepalive stalled ~2 s by the PostgreSQL restart must not lapse it
AUTOMATIC = [f"ckpt/d{i:03d}" for i in range(5)]
PINNED = "pinned/p0"
REGIONS = ["eu-west", "eu-central", "eu-north", "us-east"]


def _postgres() -> PostgresService:
    service = Stack(load_settings()).services()["postgres"]
    assert isinstance(service, PostgresService)
    return service


def _fast_shutdown(service: PostgresService, timeout_s: float = 30) -> None:
    pid = service.process.pid()
    assert pid is not None, "the stack's PostgreSQL is not running"
    os.kill(pid, signal.SIGINT)  # "fast" shutdown: clients are cut off at once
    until_sync(lambda: service.process.pid() is None, timeout_s, "PostgreSQL to stop")


def _restart() -> None:
    """Start the stack's PostgreSQL again and wait until it answers, from a short-lived
    process, as `meridian stack up` would: the postmaster must not be this process's
    child (it outlives the test session)."""
    code = (
        "from controlplane.settings import load_settings\n"
        "from controlplane.stack.manager import Stack\n"
        "Stack(load_settings()).services()['postgres'].start()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def _scratch_database(server_url: str) -> Iterator[str]:
    """A fresh database on the stack's PostgreSQL. Each statement gets a connection of
    its own: a pooled one would not survive the restart."""
    base = make_url(server_url)
    name = f"meridian_outage_{uuid.uuid4().hex[:12]}"

    def admin(sql: str) -> None:
        with psycopg.connect(
            host=base.host, port=base.port, user=base.username, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # a literal built from a uuid

    admin(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def world(
    tmp_path: Path, etcd3: EtcdCluster, coord: EtcdCoordination, postgres_url: str
) -> Iterator[dict[str, str]]:
    # `coord` first: it wipes /meridian/ before the policy is published.
    with _scratch_database(postgres_url) as url:
        env = {
            "MERIDIAN_CATALOG": url,
            "MERIDIAN_ETCD": ",".join(etcd3.endpoints),
            "MERIDIAN_HOME": str(tmp_path / "home"),
        }
        yield apply_world(tmp_path, env, policy_yaml(len(AUTOMATIC)))


def _journal(url: str) -> list[JournalEntry]:
    bridge = CatalogBridge.open(url)
    try:
        return bridge.since(None)
    finally:
        bridge.close()


async def test_controllers_ride_out_a_catalog_outage_and_journal_the_failover_after(
    coord: EtcdCoordination,
    world: dict[str, str],
    procs: list[ControllerProcess],
    tmp_path: Path,
) -> None:
    own = Ownership(coord)
    for region in REGIONS:
        proc = ControllerProcess(
            region, world, tmp_path / f"{region}.log", lease_ttl_s=TTL, controller_id=region
        )
        procs.append(proc.start())
    by_region = dict(zip(REGIONS, procs, strict=True))

    async def owners() -> dict[str, tuple[str, int]]:
        return {d: (o.region, o.epoch) for d, o in (await own.list()).items()}

    async def all_in(region: str, datasets: list[str]) -> bool:
        now = await owners()
        return all(now.get(d, ("", 0))[0] == region for d in datasets)

    async def leases() -> dict[str, int]:
        kvs, _ = await coord.get_prefix("/meridian/regions/")
        return {kv.key: kv.lease for kv in kvs if kv.key.endswith("/alive")}

    async def all_alive() -> bool:
        return len(await leases()) == len(REGIONS)

    assert await wait_until(lambda: all_in("eu-west", [*AUTOMATIC, PINNED]), 30)
    assert await wait_until(all_alive, 10)
    leases_before = await leases()
    samples: list[dict[str, tuple[str, int]]] = []

    async def sample(stop: asyncio.Event) -> None:
        for _ in range(20_000):  # bounded: 20 ms a sample, the scenario takes < 60 s
            if stop.is_set():
                return
            samples.append(await owners())
            await asyncio.sleep(0.02)  # the sampling period, not a wait for anything

    stop_sampling = asyncio.Event()
    sampler = asyncio.create_task(sample(stop_sampling))
    postgres = _postgres()
    try:
        down_at = time.monotonic()
        await asyncio.to_thread(_fast_shutdown, postgres)
        # Two lease TTLs and more without a catalog: every controller stays up and
        # active, with the lease it had, and nothing moves.
        await asyncio.sleep(2 * TTL + 1)
        assert all(p.proc is not None and p.proc.poll() is None for p in procs)
        assert await leases() == leases_before
        assert await all_in("eu-west", [*AUTOMATIC, PINNED])

        # The real failover, still without a catalog.
        by_region["eu-west"].kill()
        killed_at = time.monotonic()
        # About a TTL (lapse, expiry, claims); the rest is room for a loaded machine.
        assert await wait_until(lambda: all_in("eu-central", AUTOMATIC), TTL + 8)
        moved_s = time.monotonic() - killed_at
        assert (await owners())[PINNED][0] == "eu-west"  # manual mode: it stays
        assert _journal_unreachable(world["MERIDIAN_CATALOG"])

        # A controller started during the outage takes its region's lease all the same
        # (eu-west's supervisor restarts it; what already moved stays where it is).
        fresh = ControllerProcess(
            "eu-west", world, tmp_path / "eu-west-2.log", lease_ttl_s=TTL, controller_id="eu-west-2"
        )
        procs.append(fresh.start())

        async def fresh_alive() -> bool:
            kv = await coord.get("/meridian/regions/eu-west/alive")
            return kv is not None and json.loads(kv.value)["controller"] == "eu-west-2"

        assert await wait_until(fresh_alive, 2 * TTL + 10)
        assert fresh.has_event("catalog_unreachable_at_start")
    finally:
        restart_at = time.monotonic()
        await asyncio.to_thread(_restart)
        up_at = time.monotonic()  # healthy (a query answered)
    outage_s = up_at - down_at

    # Catch-up: the rows of the five moves reach the catalog, once each.
    def caught_up() -> bool:
        return (
            len([e for e in _journal(world["MERIDIAN_CATALOG"]) if e.to_region == "eu-central"])
            == 5
        )

    async def caught_up_async() -> bool:
        return await asyncio.to_thread(caught_up)

    assert await wait_until(caught_up_async, 20, step_s=0.1)
    caught_up_at = time.monotonic()
    catch_up_s, since_restart_s = caught_up_at - up_at, caught_up_at - restart_at
    # Not a synchronisation: the window in which a second flush or backfill would show
    # as a duplicate.
    await asyncio.sleep(1)
    stop_sampling.set()
    await sampler

    rows = _journal(world["MERIDIAN_CATALOG"])
    assert sorted((r.dataset, r.from_region, r.to_region, r.reason, r.kind) for r in rows) == [
        (d, "eu-west", "eu-central", "lease expired", "automatic") for d in AUTOMATIC
    ]
    for r in rows:
        # The RPO exposure could not be measured without the catalog; the row says so.
        assert r.details.get("rpo_versions_unknown") is True, r.details
        # Every live controller races the moves; the transaction picks one winner.
        assert r.actor in {f"controller {c}/{c}" for c in REGIONS[1:]}, r.actor
    final = await owners()
    assert {d: r for d, (r, _) in final.items()} == {
        **{d: "eu-central" for d in AUTOMATIC},
        PINNED: "eu-west",
    }
    assert epoch_violations(samples) == []
    changed = {
        (d, before[d][0], after[d][0])
        for before, after in itertools.pairwise(samples)
        for d in after
        if d in before and before[d] != after[d]
    }
    assert changed == {(d, "eu-west", "eu-central") for d in AUTOMATIC}
    for proc in [*(by_region[r] for r in REGIONS[1:]), fresh]:
        assert not proc.has_event("step_down"), proc.log_path
        assert proc.proc is not None and proc.proc.poll() is None, f"{proc.log_path} exited"
        assert proc.stop() == 0  # SIGTERM: a clean exit
    print(
        f"\ncatalog outage: {outage_s:.1f} s (PostgreSQL down, lease TTL {TTL} s); "
        f"failover during it: {moved_s:.2f} s after SIGKILL; "
        f"journal catch-up: rows in the catalog {catch_up_s:.2f} s after PostgreSQL was "
        f"healthy again ({since_restart_s:.2f} s after its restart began)"
    )


def _journal_unreachable(url: str) -> bool:
    try:
        _journal(url)
    except Exception:  # noqa: BLE001 - any failure means the catalog is down, as intended
        return True
    return False
