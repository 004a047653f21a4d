"""Runbook commands through the real CLI edge, real catalog (SQLite) and real etcd."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.cli.main import run
from controlplane.coordination import keys
from controlplane.coordination.ownership import Ownership
from controlplane.coordination.testing import prepare_catalog
from controlplane.stack.etcd import EtcdCluster

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
    assert {"region": "*", "dataset": "pinned/p0"}.items() <= plan["rejected"][0].items()
    code, out, _ = cli(capsys, "region", "drain", "eu-west", "--dry-run", "-o", "json")
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
        (["region", "drain", "mars-1", "--yes"], "unknown"),
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
    world: dict[str, str], etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = open_catalog(world["MERIDIAN_CATALOG"])
    try:
        catalog.register_version("ckpt/d000", "shard-0", "v1", "sha256:aa")
        catalog.set_replica_state("ckpt/d000", "shard-0", "v1", "eu-west", "completed")
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
        catalog.set_replica_state("ckpt/d000", "shard-0", "v1", "eu-central", "completed")
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
    assert [(h["kind"], h["aborted"], h["reason"]) for h in history] == [
        ("switchover", True, "rebalance"),
        ("switchover", False, "rebalance"),
    ]
    assert all("@" in h["actor"] for h in history)  # the OS user and host
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
    regions = {r["name"]: r for r in json.loads(out)}
    assert regions["eu-west"]["owns"] == ["ckpt/d000", "ckpt/d001", "pinned/p0"]
    assert regions["eu-north"]["alive"] is False and regions["eu-west"]["state"] == "active"
    assert cli(capsys, "pause", "--reason", "upgrade")[0] == 0
    assert cli(capsys, "resume")[0] == 0
    code, _, _ = cli(capsys, "region", "drain", "eu-west", "--yes", "-o", "json")
    assert code == 0
    code, out, _ = cli(capsys, "region", "list", "-o", "json")
    regions = {r["name"]: r for r in json.loads(out)}
    assert regions["eu-west"]["state"] == "draining" and regions["eu-west"]["owns"] == []
    assert cli(capsys, "region", "undrain", "eu-west")[0] == 0
    code, out, _ = cli(capsys, "history", "-o", "json")
    assert {h["kind"] for h in json.loads(out)} == {"drain"}


def test_controller_for_an_unknown_region_exits_nonzero(
    world: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "controller", "run", "--region", "mars-1")
    assert code != 0
    assert "region 'mars-1' is not in the applied topology" in err
