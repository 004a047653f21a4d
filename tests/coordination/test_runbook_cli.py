"""Runbook commands through the real CLI edge, real catalog (SQLite) and real etcd."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harness.children import popen
from harness.cli_schema import check_output
from harness.controllers import meridian_argv, prepare_catalog
from harness.digests import fake_digest

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.cli.main import run
from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, FencedResource
from controlplane.coordination.protocols.follow import follow_ownership
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.policy.placer import place
from controlplane.stack.etcd import EtcdCluster

from .helpers import wait_until

pytestmark = pytest.mark.integration

ALIVE = ["eu-west", "eu-central", "us-east"]  # eu-north is dead


async def _seed(endpoints: list[str]) -> None:
    async with EtcdCoordination(endpoints, timeout_s=5) as c:
        await c.delete("/meridian/", prefix=True)
        lease = await c.grant(120)
        for region in ALIVE:
            await c.put(keys.alive(region), b"{}", lease=lease.id)
        own = Ownership(c)
        for ds in ("ckpt/d000", "ckpt/d001", "pinned/p0"):
            await own.claim(ds, "eu-west", expect_epoch=0, reason="seed", actor="test")


async def _owners(endpoints: list[str]) -> tuple[dict[str, tuple[str, int]], int]:
    async with EtcdCoordination(endpoints, timeout_s=5) as c:
        owners = await Ownership(c).list()
        return {d: (o.region, o.epoch) for d, o in owners.items()}, await c.revision()


@pytest.fixture
def world(
    tmp_path: Path, etcd3: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    env = prepare_catalog(tmp_path / "w", etcd3.endpoints, 2)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    asyncio.run(_seed(etcd3.endpoints))
    yield env
    asyncio.run(_cleanup(etcd3.endpoints))


async def _cleanup(endpoints: list[str]) -> None:
    async with EtcdCoordination(endpoints, timeout_s=5) as c:
        await c.delete("/meridian/", prefix=True)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_runs_print_the_plan_and_change_nothing(
    world: dict[str, str], etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    before = asyncio.run(_owners(etcd3.endpoints))
    code, out, _ = cli(
        capsys,
        "switchover",
        "--dataset",
        "ckpt/d000",
        "--to",
        "eu-central",
        "--dry-run",
        "-o",
        "json",
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["moves"] == [
        {
            "dataset": "ckpt/d000",
            "from": "eu-west",
            "to": "eu-central",
            "epoch_before": before[0]["ckpt/d000"][1],
        }
    ]
    code, out, _ = cli(
        capsys, "failover", "--from", "eu-west", "--force", "--dry-run", "-o", "json"
    )
    assert code == 0
    plan = json.loads(out)
    assert {m["dataset"] for m in plan["moves"]} == {"ckpt/d000", "ckpt/d001"}
    check_output("runbook_dry_run", plan)
    pinned = [r for r in plan["rejected"] if r["dataset"] == "pinned/p0"]
    assert pinned and all(r["reason"].startswith("manual mode") for r in pinned)
    assert {r["region"] for r in pinned} <= {"eu-central", "eu-north", "us-east"}  # regions
    code, out, _ = cli(capsys, "region", "drain", "eu-west", "--dry-run", "-o", "json")
    check_output("runbook_dry_run", json.loads(out))
    assert code == 0 and len(json.loads(out)["moves"]) == 3  # a drain moves manual ones too
    assert asyncio.run(_owners(etcd3.endpoints)) == before  # same owners, same revision
    code, out, _ = cli(capsys, "history", "-o", "json")
    assert json.loads(out) == []


def test_bad_input_gets_one_sentence_and_changes_nothing(
    world: dict[str, str], etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    before = asyncio.run(_owners(etcd3.endpoints))
    cases = [
        (
            ["switchover", "--dataset", "ckpt/d000", "--to", "us-east", "--yes"],
            "residency: jurisdiction US",
        ),
        (["switchover", "--dataset", "ckpt/d000", "--to", "eu-north", "--yes"], "dead"),
        (
            ["switchover", "--dataset", "ckpt/nope", "--to", "eu-central", "--yes"],
            "unknown dataset",
        ),
        (
            ["switchover", "--dataset", "ckpt/d000", "--to", "mars-1", "--yes"],
            "unknown target region",
        ),
        (["failover", "--from", "eu-west", "--yes"], "still alive"),
        (["failover", "--from", "eu-west", "--to", "us-east", "--force", "--yes"], "residency"),
        (["region", "drain", "mars-1", "--yes"], "error: unknown region 'mars-1': the"),
        (["region", "undrain", "mars-1"], "error: unknown region 'mars-1': the"),
        (["failover", "--from", "eu-north", "--to", "eu-north", "--yes"], "--to eu-north is the"),
        (["--etcd", "127.0.0.1:1", "region", "list"], "unreachable"),
        (["--etcd", "127.0.0.1:1", "controller", "run", "--region", "eu-west"], "unreachable"),
    ]
    for args, needle in cases:
        code, _, err = cli(capsys, *args)
        assert code != 0, args
        assert needle in err, (args, err)
        assert err.count("\n") == 1 and err.startswith("error: "), err
        assert "Traceback" not in err
    assert asyncio.run(_owners(etcd3.endpoints)) == before


def test_switchover_aborts_on_timeout_then_succeeds_once_caught_up(
    world: dict[str, str],
    etcd3: EtcdCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    catalog = open_catalog(world["MERIDIAN_CATALOG"], placer=place)
    try:
        catalog.register_version("ckpt/d000", "shard-0", "v1", fake_digest("aa"))
        catalog.set_replica_state(
            "ckpt/d000", "shard-0", "v1", "eu-west", "completed", digest=fake_digest("aa")
        )
        catalog.set_replica_state("ckpt/d000", "shard-0", "v1", "eu-central", "pending")
        before = asyncio.run(_owners(etcd3.endpoints))[0]["ckpt/d000"]
        code, _, err = cli(
            capsys,
            "switchover",
            "--dataset",
            "ckpt/d000",
            "--to",
            "eu-central",
            "--yes",
            "--timeout",
            "0.5",
            "--reason",
            "rebalance",
        )
        assert code != 0 and "aborted" in err and "eu-west still owns it" in err
        assert asyncio.run(_owners(etcd3.endpoints))[0]["ckpt/d000"] == before
        catalog.set_replica_state(
            "ckpt/d000", "shard-0", "v1", "eu-central", "completed", digest=fake_digest("aa")
        )
    finally:
        catalog.close()
    code, out, _ = cli(
        capsys,
        "switchover",
        "--dataset",
        "ckpt/d000",
        "--to",
        "eu-central",
        "--yes",
        "--reason",
        "rebalance",
        "-o",
        "json",
    )
    assert code == 0
    [moved] = json.loads(out)
    assert moved["to"] == "eu-central" and moved["epoch"] > before[1]
    code, out, _ = cli(capsys, "history", "-o", "json")
    history = json.loads(out)
    assert [(h["kind"], h["outcome"], h["to"], h["completed_at"] is None) for h in history] == [
        ("switchover", "aborted", "eu-west", True),  # no move: eu-west kept it
        ("switchover", "moved", "eu-central", False),
    ]
    assert history[0]["reason"].startswith("aborted: switchover to eu-central not done, 1 ")
    assert history[0]["reason"].endswith("(reason given: rebalance)")
    assert history[1]["reason"] == "rebalance"
    assert all("@" in h["actor"] for h in history)  # the OS user and host
    code, out, _ = cli(capsys, "audit", "failovers", "-o", "json")
    check_output("audit_failovers", json.loads(out))
    assert code == 0  # auditors filter on the outcome column, not on the reason's text
    assert [(a["id"], a["outcome"]) for a in json.loads(out)] == [
        (h["id"], h["outcome"]) for h in history
    ]
    bridge = CatalogBridge.open(world["MERIDIAN_CATALOG"])
    try:  # the journal lookup the controller's backfill relies on
        ids = [h["id"] for h in history]
        assert bridge.missing([*ids, "ckpt/d000@1"]) == {"ckpt/d000@1"}
    finally:
        bridge.close()
    monkeypatch.setenv("COLUMNS", "1000")  # a wide table, so its cells are not folded
    _assert_aborted_row_is_visible_in_every_format(capsys, history[0]["id"])
    code, out, _ = cli(capsys, "dataset", "list", "-o", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert (
        rows["ckpt/d000"]["owner"] == "eu-central" and rows["ckpt/d000"]["epoch"] == moved["epoch"]
    )
    code, out, _ = cli(capsys, "dataset", "show", "ckpt/d000", "-o", "json")
    shown = json.loads(out)
    assert shown["owner"] == "eu-central"
    assert {(o["object"], o["region"], o["state"]) for o in shown["objects"]} == {
        ("shard-0", "eu-west", "completed"),
        ("shard-0", "eu-central", "completed"),
    }
    assert set(rows["ckpt/d000"]) >= {
        "name",
        "class",
        "policy",
        "home",
        "owner",
        "epoch",
        "replicas",
        "lag_s",
    }


def test_region_list_pause_resume_and_undrain(
    world: dict[str, str], etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "region", "list", "-o", "json")
    check_output("region_list", json.loads(out))
    regions = {r["name"]: r for r in json.loads(out)}
    assert regions["eu-west"]["owns"] == ["ckpt/d000", "ckpt/d001", "pinned/p0"]
    assert regions["eu-north"]["alive"] is False and regions["eu-west"]["state"] == "active"
    assert cli(capsys, "pause", "--reason", "upgrade")[0] == 0
    first = asyncio.run(_get(etcd3.endpoints, keys.MAINTENANCE))
    # C5: a second pause keeps the first one's reason, actor and time, and says so.
    code, out, _ = cli(capsys, "pause", "--reason", "another")
    assert code == 0 and "already paused since" in out and "(upgrade)" in out
    assert asyncio.run(_get(etcd3.endpoints, keys.MAINTENANCE)) == first
    assert first is not None and json.loads(first)["reason"] == "upgrade"
    assert cli(capsys, "resume")[0] == 0
    assert asyncio.run(_get(etcd3.endpoints, keys.MAINTENANCE)) is None
    code, _, _ = cli(capsys, "region", "drain", "eu-west", "--yes", "-o", "json")
    assert code == 0
    code, out, _ = cli(capsys, "region", "list", "-o", "json")
    regions = {r["name"]: r for r in json.loads(out)}
    assert regions["eu-west"]["state"] == "draining" and regions["eu-west"]["owns"] == []
    assert cli(capsys, "region", "undrain", "eu-west")[0] == 0
    code, out, _ = cli(capsys, "history", "-o", "json")
    assert {h["kind"] for h in json.loads(out)} == {"drain"}
    # C4: one --since parser for history and audit: durations and RFC 3339, bounded.
    for command in (["history"], ["audit", "failovers"]):
        for since, count in (("2026-01-01T00:00:00Z", 3), ("2999-01-01T00:00:00Z", 0)):
            code, out, err = cli(capsys, *command, "--since", since, "-o", "json")
            assert code == 0 and len(json.loads(out)) == count, (command, since, err)
        code, out, _ = cli(capsys, *command, "--since", "1h", "-o", "json")
        assert code == 0 and len(json.loads(out)) == 3
        for bad, needle in (("99999999999d", "more than 36500 days"), ("yesterday", "neither")):
            code, _, err = cli(capsys, *command, "--since", bad)
            assert code == 1 and needle in err and err.count("\n") == 1, (command, err)
            assert "internal error" not in err


def test_controller_for_an_unknown_region_exits_nonzero(
    world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "controller", "run", "--region", "mars-1")
    assert code != 0
    assert "region 'mars-1' is not in the applied topology" in err


def test_home_region_takes_a_dataset_back_and_unmovable_datasets_fail_the_command(
    world: dict[str, str], etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """C1: home is a candidate; a runbook that cannot move a dataset exits 1 naming it."""
    switch = ["switchover", "--dataset", "ckpt/d000", "--to", "eu-central", "--yes"]
    assert cli(capsys, *switch)[0] == 0
    # Draining eu-central sends ckpt/d000 home (failover.order has only eu-central/-north).
    code, out, err = cli(capsys, "region", "drain", "eu-central", "--yes", "-o", "json")
    assert code == 0, err
    assert [(m["dataset"], m["to"]) for m in json.loads(out)] == [("ckpt/d000", "eu-west")]
    assert cli(capsys, "region", "undrain", "eu-central")[0] == 0
    assert cli(capsys, *switch)[0] == 0
    asyncio.run(_cleanup_key(etcd3.endpoints, keys.alive("eu-central")))  # eu-central dies
    code, out, _ = cli(capsys, "failover", "--from", "eu-central", "--dry-run", "-o", "json")
    plan = json.loads(out)
    assert code == 0 and plan["moves"][0]["to"] == "eu-west"
    assert all(r["region"] != "eu-central" for r in plan["rejected"])
    code, out, err = cli(capsys, "failover", "--from", "eu-central", "--yes", "-o", "json")
    assert code == 0, err
    assert [(m["dataset"], m["to"]) for m in json.loads(out)] == [("ckpt/d000", "eu-west")]
    # Now eu-west owns everything and both EU alternatives are dead: nothing can move.
    before = asyncio.run(_owners(etcd3.endpoints))
    code, out, err = cli(capsys, "region", "drain", "eu-west", "--yes", "-o", "json")
    last = err.splitlines()[-1]  # the plan went to stderr first (stdout is for JSON)
    assert code == 1 and out == ""
    assert last.startswith("error: drain of eu-west refused, nothing changed: 3 dataset(s)")
    assert "ckpt/d000: no eligible candidate (eu-central: dead, eu-north: dead)" in last
    assert "pinned/p0" in last
    code, out, err = cli(capsys, "failover", "--from", "eu-west", "--force", "--yes", "-o", "json")
    last = err.splitlines()[-1]
    assert code == 1 and json.loads(out) == []
    assert "failover of eu-west is incomplete" in last and "ckpt/d001: no eligible" in last
    assert "pinned/p0: manual mode" in last
    assert asyncio.run(_owners(etcd3.endpoints)) == before
    code, out, _ = cli(capsys, "region", "list", "-o", "json")
    assert {r["name"]: r["state"] for r in json.loads(out)}["eu-west"] == "active"


async def _cleanup_key(endpoints: list[str], key: str) -> None:
    async with EtcdCoordination(endpoints, timeout_s=5) as c:
        await c.delete(key)


def _assert_aborted_row_is_visible_in_every_format(
    capsys: pytest.CaptureFixture[str], aborted_id: str
) -> None:
    """C3: an auditor tells the aborted switchover from a move in csv, json and table."""
    contract = ["id", "dataset", "from", "to", "epoch", "reason", "actor", "started_at"]
    for command in (["history"], ["audit", "failovers"]):
        code, out, _ = cli(capsys, *command, "-o", "csv")
        assert code == 0
        rows = list(csv.DictReader(io.StringIO(out)))
        # The RPO exposure is a column of both (it was JSON-only in history).
        assert set(rows[0]) >= {*contract, "completed_at", "rpo_versions"}, command
        [aborted] = [r for r in rows if r["id"] == aborted_id]
        assert aborted["from"] == aborted["to"] == "eu-west", command
        assert aborted["reason"].startswith("aborted: switchover to eu-central"), command
        assert aborted["completed_at"] == "", command
        code, out, _ = cli(capsys, *command, "-o", "table")
        assert code == 0 and "aborted: switchover to eu-central" in out, command
        code, out, _ = cli(capsys, *command, "-o", "json")
        [row] = [r for r in json.loads(out) if r["id"] == aborted_id]
        assert row["to"] == "eu-west" and row["completed_at"] is None, command
        assert row["details"]["intended_to"] == "eu-central", command  # as journaled


def test_dataset_list_and_show_cover_unplaced_datasets_exact_names_and_lag(
    world: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C2: unplaced datasets are listed, `show` takes an exact name, lag_s is measured."""
    catalog = open_catalog(world["MERIDIAN_CATALOG"], placer=place)
    try:
        catalog.register_dataset("scratch/x")  # no applied policy selects scratch/*
        written = datetime.now(UTC) - timedelta(seconds=30)
        catalog.register_version(
            "ckpt/d000",
            "shard-0",
            "v1",
            fake_digest("aa"),
            origin_region="eu-west",
            created_at=written,
        )
        catalog.set_replica_state(
            "ckpt/d000", "shard-0", "v1", "eu-west", "completed", digest=fake_digest("aa")
        )
        catalog.set_replica_state(
            "ckpt/d000", "shard-0", "v1", "eu-central", "completed", digest=fake_digest("aa")
        )
        catalog.set_replica_state("ckpt/d000", "shard-0", "v1", "eu-north", "pending")
    finally:
        catalog.close()
    code, out, _ = cli(capsys, "dataset", "list", "-o", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == {"ckpt/d000", "ckpt/d001", "pinned/p0", "scratch/x"}
    check_output("dataset_list", list(rows.values()))
    # Unplaced: nothing fences it, so it is standard (the contract's class is never null).
    assert (rows["scratch/x"]["class"], rows["scratch/x"]["policy"]) == ("standard", None)
    assert rows["scratch/x"]["lag_s"] is None and rows["scratch/x"]["replicas"] == []
    assert 29 <= rows["ckpt/d000"]["lag_s"] < 120  # eu-north has not completed v1
    assert rows["ckpt/d001"]["lag_s"] == 0.0  # nothing written: nothing behind
    code, out, _ = cli(capsys, "dataset", "list", "--glob", "scratch/*", "-o", "json")
    assert [r["name"] for r in json.loads(out)] == ["scratch/x"]
    code, _, err = cli(capsys, "dataset", "show", "*")
    assert code == 1 and "unknown dataset '*'" in err
    code, out, _ = cli(capsys, "dataset", "show", "scratch/x", "-o", "json")
    assert code == 0 and json.loads(out)["objects"] == []
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = cli(capsys, "dataset", "show", "ckpt/d000", "-o", "table")
    assert code == 0 and "where each version lives" in out and "eu-north" in out
    assert not out.lstrip().startswith("{")
    code, out, _ = cli(capsys, "dataset", "show", "ckpt/d000", "-o", "csv")
    shown = list(csv.DictReader(io.StringIO(out)))
    assert {(r["name"], r["region"], r["state"]) for r in shown} == {
        ("ckpt/d000", "eu-west", "completed"),
        ("ckpt/d000", "eu-central", "completed"),
        ("ckpt/d000", "eu-north", "pending"),
    }


async def _get(endpoints: list[str], key: str) -> bytes | None:
    async with EtcdCoordination(endpoints, timeout_s=5) as c:
        kv = await c.get(key)
        return None if kv is None else kv.value


def _lagging_target(catalog_url: str, dataset: str, target: str) -> None:
    """A version `target` has not completed: a switchover to it waits (freezing writes)."""
    catalog = open_catalog(catalog_url)
    try:
        catalog.register_version(
            dataset, "shard-0", "v1", fake_digest("aa"), origin_region="eu-west"
        )
        catalog.set_replica_state(
            dataset, "shard-0", "v1", "eu-west", "completed", digest=fake_digest("aa")
        )
        catalog.set_replica_state(dataset, "shard-0", "v1", target, "pending")
    finally:
        catalog.close()


def _switchover_process(env: dict[str, str], log: Path, ttl_s: int) -> subprocess.Popen[bytes]:
    args = ["switchover", "--dataset", "ckpt/d000", "--to", "eu-central", "--yes"]
    with open(log, "wb") as out:
        return popen(
            [*meridian_argv(), *args, "--timeout", "120"],
            env={**os.environ, **env, "MERIDIAN_LEASE_TTL_S": str(ttl_s)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _admits(resource: FencedResource, epoch: int) -> bool:
    try:
        resource.admit("ckpt/d000", epoch)
    except DatasetHandingOverError:
        return False
    return True


async def _frozen(resource: FencedResource, epoch: int) -> bool:
    return not await _admits(resource, epoch)


def test_a_sigkilled_switchover_unfreezes_its_dataset_within_one_lease_ttl(
    world: dict[str, str], etcd3: EtcdCluster, tmp_path: Path
) -> None:
    """A real `meridian switchover` process, SIGKILLed while it waits for the target:
    its handover mark lives on its lease, so about one lease TTL later the dataset is
    writable again at the same epoch, for a resource that follows ownership, and
    ownership never moved."""
    ttl_s = 3
    # The lease lapses up to one TTL after the last renewal, then etcd's expiry pass (every
    # 0.5 s) revokes it through the cluster and the watch delivers the delete: over the
    # TTL even on a quiet machine, seconds more on a loaded one. Without the lease the mark
    # would stay for the runbook's whole --timeout (120 s), far beyond this.
    lapse_s = ttl_s + 5
    _lagging_target(world["MERIDIAN_CATALOG"], "ckpt/d000", "eu-central")
    proc = _switchover_process(world, tmp_path / "switchover.log", ttl_s)

    async def scenario() -> float:
        async with EtcdCoordination(etcd3.endpoints, timeout_s=5) as c:
            before = await Ownership(c).get("ckpt/d000")
            assert before is not None and before.region == "eu-west"
            resource = FencedResource()
            ready = asyncio.Event()
            follower = asyncio.create_task(follow_ownership(c, resource, ready))
            try:
                await asyncio.wait_for(ready.wait(), 5)
                assert await wait_until(lambda: _frozen(resource, before.epoch), 30), (
                    tmp_path / "switchover.log"
                ).read_text()
                mark = await Ownership(c).handover("ckpt/d000")
                assert mark is not None and mark.lease != 0
                assert await c.lease_ttl(mark.lease) > 0
                os.kill(proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                proc.wait(10)
                assert await wait_until(lambda: _admits(resource, before.epoch), lapse_s)
                unfrozen_after = time.monotonic() - killed
                assert await Ownership(c).get("ckpt/d000") == before
                assert await c.get(keys.handover("ckpt/d000")) is None
                return unfrozen_after
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)

    try:
        unfrozen_after = asyncio.run(scenario())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    print(f"writable again {unfrozen_after:.2f} s after SIGKILL (lease TTL {ttl_s} s)")
    assert unfrozen_after <= lapse_s


def test_abort_ends_a_switchover_whose_runbook_is_stuck_and_journals_it(
    world: dict[str, str],
    etcd3: EtcdCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`switchover --abort` removes the mark of a runbook that is still waiting, the
    old owner keeps the dataset at the same epoch, and the journal has one aborted row
    (the runbook, stopped afterwards, does not add a second one)."""
    code, _, err = cli(capsys, "switchover", "--dataset", "ckpt/d000", "--abort", "--yes")
    assert code == 1 and "no switchover of ckpt/d000 is in progress" in err
    code, _, err = cli(capsys, "switchover", "--dataset", "ckpt/d000")
    assert code == 1 and "switchover needs --to REGION" in err
    code, _, err = cli(
        capsys, "switchover", "--dataset", "ckpt/d000", "--abort", "--to", "eu-central"
    )
    assert code == 1 and "takes no --to" in err
    _lagging_target(world["MERIDIAN_CATALOG"], "ckpt/d000", "eu-central")
    before = asyncio.run(_owners(etcd3.endpoints))[0]["ckpt/d000"]
    code, out, _ = cli(
        capsys, "switchover", "--dataset", "ckpt/d000", "--to", "eu-central", "--dry-run",
        "-o", "json",
    )  # fmt: skip
    assert code == 0
    check_output("runbook_dry_run", json.loads(out))
    proc = _switchover_process(world, tmp_path / "switchover.log", 5)
    try:

        async def marked() -> bool:
            return await _get(etcd3.endpoints, keys.handover("ckpt/d000")) is not None

        assert asyncio.run(wait_until(marked, 30)), (tmp_path / "switchover.log").read_text()
        again = ["switchover", "--dataset", "ckpt/d000", "--to", "eu-central", "--yes"]
        code, _, err = cli(capsys, *again)
        assert code == 1 and "already handing over to eu-central" in err
        assert "meridian switchover --dataset ckpt/d000 --abort" in err
        code, _, err = cli(capsys, "switchover", "--dataset", "ckpt/d000", "--abort")
        assert code == 1 and "pass --yes" in err  # not a terminal: no silent abort
        assert asyncio.run(marked())
        code, out, err = cli(
            capsys, "switchover", "--dataset", "ckpt/d000", "--abort", "--yes", "-o", "json"
        )
        assert code == 0, err
        done = json.loads(out)
        assert (done["from"], done["intended_to"], done["epoch"]) == (
            "eu-west",
            "eu-central",
            before[1],
        )
        assert not asyncio.run(marked())
        assert asyncio.run(_owners(etcd3.endpoints))[0]["ckpt/d000"] == before
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    code, out, _ = cli(capsys, "history", "-o", "json")
    check_output("history", json.loads(out))
    rows = [r for r in json.loads(out) if r["dataset"] == "ckpt/d000"]
    assert [(r["id"], r["outcome"]) for r in rows] == [(done["journal_id"], "aborted")]
    assert rows[0]["reason"].startswith("aborted: switchover to eu-central not done, ended by")
    assert (rows[0]["from"], rows[0]["to"], rows[0]["completed_at"]) == ("eu-west", "eu-west", None)


def test_pause_and_resume_need_only_etcd(
    world: dict[str, str],
    etcd3: EtcdCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The catalog may live in the region being lost: pausing failover must still work.
    monkeypatch.setenv("MERIDIAN_CATALOG", f"sqlite:///{tmp_path / 'no-such-catalog.db'}")
    code, _, err = cli(capsys, "pause", "--reason", "the catalog's region is down")
    assert code == 0, err
    stored = asyncio.run(_get(etcd3.endpoints, keys.MAINTENANCE))
    assert stored is not None and json.loads(stored)["reason"] == "the catalog's region is down"
    assert cli(capsys, "resume")[0] == 0
    assert asyncio.run(_get(etcd3.endpoints, keys.MAINTENANCE)) is None
