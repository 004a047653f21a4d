"""Real `meridian controller run` processes against the three-member etcd cluster.

SIGKILL, SIGSTOP/SIGCONT and an etcd leader kill, with ownership sampled all along.
These take a few lease TTLs each, hence `slow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

import httpx
import pytest
from harness.controllers import ControllerProcess, prepare_catalog, run_cli
from harness.digests import fake_digest
from harness.invariants import epoch_violations, split_brain
from harness.ports import free_port

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.coordination.protocols.fencing import DirectoryEpochs
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.policy.placer import place
from controlplane.stack.etcd import EtcdCluster

from .helpers import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TTL = 5
AUTOMATIC = [f"ckpt/d{i:03d}" for i in range(5)]


@pytest.fixture
def env(tmp_path: Path, etcd3: EtcdCluster, coord: EtcdCoordination) -> dict[str, str]:
    # `coord` first: it wipes /meridian/ before the policy is published.
    return prepare_catalog(tmp_path / "world", etcd3.endpoints, len(AUTOMATIC))


def spawn(
    procs: list[ControllerProcess],
    env: dict[str, str],
    tmp: Path,
    region: str,
    fence: Path,
    metrics: str | None = None,
) -> ControllerProcess:
    p = ControllerProcess(
        region,
        env,
        tmp / f"{region}-{len(procs)}.log",
        fence,
        lease_ttl_s=TTL,
        metrics_addr=metrics,
    ).start()
    procs.append(p)
    return p


class Sampler:
    """Reads every owner every 20 ms while a scenario runs."""

    def __init__(self, coord: EtcdCoordination) -> None:
        self.own = Ownership(coord)
        self.samples: list[dict[str, tuple[str, int]]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        for _ in range(10_000):
            owners = await self.own.list()
            self.samples.append({d: (o.region, o.epoch) for d, o in owners.items()})
            await asyncio.sleep(0.02)  # the sampling period, not a wait for anything

    def __enter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def owners_of(coord: EtcdCoordination) -> dict[str, str]:
    return {d: o.region for d, o in (await Ownership(coord).list()).items()}


async def all_owned_by(coord: EtcdCoordination, region: str, datasets: list[str]) -> bool:
    owners = await owners_of(coord)
    return all(owners.get(d) == region for d in datasets)


async def test_sigkill_moves_datasets_within_ttl_and_pause_holds_them(
    coord: EtcdCoordination, env: dict[str, str], procs: list[ControllerProcess], tmp_path: Path
) -> None:
    fence = tmp_path / "fence"
    metrics_addr = f"127.0.0.1:{free_port()}"
    central = spawn(procs, env, tmp_path, "eu-central", fence, metrics=metrics_addr)
    spawn(procs, env, tmp_path, "eu-north", fence)
    west = spawn(procs, env, tmp_path, "eu-west", fence)
    assert await wait_until(lambda: all_owned_by(coord, "eu-west", [*AUTOMATIC, "pinned/p0"]), 20)
    # RPO exposure: eu-central has not completed the latest version of d000.
    catalog = open_catalog(env["MERIDIAN_CATALOG"], placer=place)
    try:
        catalog.register_version(AUTOMATIC[0], "shard-0", "v7", fake_digest("77"))
        catalog.set_replica_state(
            AUTOMATIC[0], "shard-0", "v7", "eu-west", "completed", digest=fake_digest("77")
        )
        catalog.set_replica_state(AUTOMATIC[0], "shard-0", "v7", "eu-central", "pending")
    finally:
        catalog.close()
    sampler = Sampler(coord)
    with sampler:
        # Samples of the steady state, and a canary write of eu-west accepted, first.
        assert await wait_until(lambda: _true(len(sampler.samples) >= 10), 10)
        assert await wait_until(lambda: _accepted(fence, "eu-west"), 10)
        west.kill()
        killed = time.monotonic()
        # The lease lapses within a TTL, then etcd's expiry pass, the survivors' watch and
        # their claims: about a TTL on a quiet machine; the rest is room for a loaded one.
        assert await wait_until(lambda: all_owned_by(coord, "eu-central", AUTOMATIC), TTL + 5)
        moved_after = time.monotonic() - killed
        assert moved_after <= TTL + 5, f"failover took {moved_after:.2f} s"
        assert (await owners_of(coord))["pinned/p0"] == "eu-west"  # manual mode: not moved
        # The gauges follow ownership through a watch: await them, bounded.
        async with httpx.AsyncClient(timeout=5) as http:

            async def gauges_show_the_move() -> bool:
                text = (await http.get(f"http://{metrics_addr}/metrics")).text
                return (
                    "meridian_controller_active 1.0" in text
                    and "meridian_controller_datasets_owned 5.0" in text
                )

            assert await wait_until(gauges_show_the_move, 5)
        assert central.has_event("failover_not_moved")  # the manual one, reported

        # Maintenance mode: kill the new owner; nothing moves while paused.
        assert run_cli(["pause", "--reason", "test"], env).returncode == 0
        central.kill()
        north = procs[1]
        # eu-north sees eu-central's lease expire and, paused, decides not to move.
        assert await wait_until(lambda: _true(_paused_on(north, "eu-central")), TTL + 5)
        assert await all_owned_by(coord, "eu-central", AUTOMATIC)
        assert run_cli(["resume"], env).returncode == 0
        assert await wait_until(lambda: all_owned_by(coord, "eu-north", AUTOMATIC), TTL + 5)
    await sampler.close()
    assert procs[1].stop() == 0  # SIGTERM: a clean exit
    assert len(sampler.samples) > 50
    assert epoch_violations(sampler.samples) == []
    assert split_brain(DirectoryEpochs(fence).read_log()) == []
    history = json.loads(run_cli(["history", "--output", "json"], env).stdout)
    rpo = {(h["dataset"], h["to"]): h["rpo_versions"] for h in history}
    assert rpo[(AUTOMATIC[0], "eu-central")] == 1
    assert rpo[(AUTOMATIC[1], "eu-central")] == 0
    moves = [(h["dataset"], h["from"], h["to"], h["reason"]) for h in history]
    assert sorted(moves) == sorted(
        [(d, "eu-west", "eu-central", "lease expired") for d in AUTOMATIC]
        + [(d, "eu-central", "eu-north", "lease expired") for d in AUTOMATIC]
    )


async def test_sigstopped_owner_is_fenced_and_steps_down(
    coord: EtcdCoordination, env: dict[str, str], procs: list[ControllerProcess], tmp_path: Path
) -> None:
    fence = tmp_path / "fence"
    spawn(procs, env, tmp_path, "eu-central", fence)
    west = spawn(procs, env, tmp_path, "eu-west", fence)
    assert await wait_until(lambda: all_owned_by(coord, "eu-west", AUTOMATIC), 20)
    assert await wait_until(lambda: _accepted(fence, "eu-west"), 10)  # west's canaries run
    west.signal(signal.SIGSTOP)
    assert await wait_until(lambda: all_owned_by(coord, "eu-central", AUTOMATIC), TTL + 4)
    # central's canaries record its newer epoch of every dataset in the fence
    assert await wait_until(lambda: _accepted(fence, "eu-central", AUTOMATIC), 10)
    resumed_at = time.time()
    west.signal(signal.SIGCONT)
    assert await wait_until(lambda: _true(west.has_event("step_down")), 10)

    def attempts_after() -> list[dict[str, object]]:
        return [
            r
            for r in DirectoryEpochs(fence).read_log()
            if r["region"] == "eu-west"
            and r["dataset"] in AUTOMATIC
            and float(r["t"]) >= resumed_at  # type: ignore[arg-type]
        ]

    def told_by_etcd() -> bool:
        """West's ownership watch delivered every loss before its canary's next write
        (its stream's buffered events and the canary's overdue timer race on wake-up:
        CI saw the watch win, and then there is rightly nothing left to attempt)."""
        lost = {
            str(e.get("dataset"))
            for e in west.events()
            if e.get("event") == "ownership_lost" and e.get("to") == "eu-central"
        }
        return lost >= set(AUTOMATIC)

    # The resumed controller either writes at its old epoch (its canary's timer is
    # overdue when it wakes) or learns of the loss from etcd first; wait for one.
    await wait_until(lambda: _true(bool(attempts_after()) or told_by_etcd()), 10)
    log = DirectoryEpochs(fence).read_log()
    west_after = attempts_after()
    assert west_after or told_by_etcd(), "the resumed controller neither wrote nor learnt"
    # Every write it attempted after waking was refused.
    assert all(not r["accepted"] for r in west_after), west_after
    # (Its "fenced" event may not be logged: the lease-loss step-down can cancel the
    # canary while the refused write is returning. The refusal is in the write log.)
    assert split_brain(log) == []
    assert await all_owned_by(coord, "eu-central", AUTOMATIC)  # it did not take them back


async def test_etcd_leader_loss_causes_no_spurious_failover(
    coord: EtcdCoordination,
    env: dict[str, str],
    procs: list[ControllerProcess],
    tmp_path: Path,
    etcd3: EtcdCluster,
) -> None:
    fence = tmp_path / "fence"
    spawn(procs, env, tmp_path, "eu-central", fence)
    spawn(procs, env, tmp_path, "eu-west", fence)
    assert await wait_until(lambda: all_owned_by(coord, "eu-west", AUTOMATIC), 20)
    before = {d: (o.region, o.epoch) for d, o in (await Ownership(coord).list()).items()}
    leader = await asyncio.to_thread(etcd3.leader_index)
    assert leader is not None
    member = etcd3.members[leader]
    member.kill()
    try:
        # Not a synchronisation: the window in which a spurious failover would show.
        await asyncio.sleep(2 * TTL + 2)
        after = {d: (o.region, o.epoch) for d, o in (await Ownership(coord).list()).items()}
        assert after == before
        history = json.loads(run_cli(["history", "--output", "json"], env).stdout)
        assert history == []
    finally:
        await asyncio.to_thread(_restart, etcd3, leader)


def _restart(cluster: EtcdCluster, index: int) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        cluster.members[index].start()
    cluster.wait_healthy(30)


async def _true(value: bool) -> bool:
    return value


async def _accepted(fence: Path, region: str, datasets: list[str] | None = None) -> bool:
    """A write of `region`'s controller has been accepted by the fenced resource (for
    each of `datasets`, when given)."""
    done = {
        str(r["dataset"])
        for r in DirectoryEpochs(fence).read_log()
        if r["region"] == region and r["accepted"]
    }
    return bool(done) if datasets is None else done >= set(datasets)


def _paused_on(proc: ControllerProcess, region: str) -> bool:
    return any(
        e.get("event") == "failover_paused" and e.get("region") == region for e in proc.events()
    )
