"""`meridian audit ...` on a small catalog with planted violations (SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness.cli_schema import check_output
from harness.digests import fake_digest
from sqlalchemy import text

from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.records import FailoverRecord, TransferRecord
from controlplane.cli.main import run
from controlplane.cli.since import parse_since
from controlplane.errors import InvalidInputError
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files
from controlplane.policy.placer import place

EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def seeded(catalog_url: str) -> Iterator[str]:
    cat: Catalog = open_catalog(catalog_url, placer=place)
    policy, problems = compile_files([EXAMPLE])
    assert policy is not None, problems
    apply_policy(cat, policy, source="t", publisher=None)
    ds = "ckpt/llama-70b"
    for key in ("a", "b"):
        cat.register_version(ds, key, "v1", fake_digest(f"sha-{key}"), size=10)
        cat.set_replica_state(
            ds, key, "v1", "eu-west", "completed", digest=fake_digest(f"sha-{key}")
        )
        cat.set_replica_state(ds, key, "v1", "eu-central", "pending")
    cat.set_replica_state(
        ds, "b", "v1", "us-east", "completed", digest=fake_digest("sha-b")
    )  # planted
    cat.register_version("corpus/web", "p", "v1", fake_digest("sha-p"))
    cat.set_replica_state(
        "corpus/web", "p", "v1", "us-east", "completed", digest=fake_digest("sha-p")
    )  # allowed (EU, US)

    def transfer(tid: str, to: str, ago_h: float, dataset: str = ds) -> TransferRecord:
        return TransferRecord(
            id=tid,
            dataset=dataset,
            object="a",
            version="v1",
            from_region="eu-west",
            to_region=to,
            logical_bytes=1000,
            wire_bytes=120,
            outcome="completed",
            at=NOW - timedelta(hours=ago_h),
        )

    cat.record_transfer(transfer("t-old", "eu-central", 48))
    cat.record_transfer(transfer("t-bad", "us-east", 2))  # planted: outside EU residency
    cat.record_transfer(transfer("t-web", "us-east", 1, dataset="corpus/web"))  # cross-border, ok
    cat.append_failover(
        FailoverRecord(
            id="f1",
            dataset=ds,
            from_region="eu-west",
            to_region="eu-central",
            epoch=7,
            kind="failover",
            reason="lost",
            actor="ops",
            detected_at=None,
            started_at=NOW - timedelta(hours=3),
            completed_at=NOW - timedelta(hours=3),
            rpo_versions=1,
            details=json.dumps({"incomplete_versions": ["k@1.0@eu-west"], "rpo_source": "agents"}),
        )
    )
    cat.close()
    yield catalog_url


def _json(capsys: pytest.CaptureFixture[str]) -> object:
    return json.loads(capsys.readouterr().out)


def test_residency_finds_exactly_the_planted(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["audit", "residency", "--catalog", seeded, "-o", "json"]) == 3
    rows = _json(capsys)
    assert isinstance(rows, list)
    check_output("audit_residency", rows)
    got = sorted(
        (r["kind"], r["dataset"], r["object"], r["region"], r["jurisdiction"]) for r in rows
    )
    assert got == [
        ("replica", "ckpt/llama-70b", "b", "us-east", "US"),
        ("transfer", "ckpt/llama-70b", "a", "us-east", "US"),
    ]
    for r in rows:
        assert r["allowed"] == ["EU"] and r["at"].endswith("Z")
        assert {"kind", "dataset", "object", "region", "jurisdiction", "allowed", "at"} <= set(r)


def test_residency_clean_exits_zero(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["audit", "residency", "--catalog", catalog_url, "-o", "json"]) == 0
    assert _json(capsys) == []
    assert run(["audit", "residency", "--catalog", catalog_url, "-o", "table"]) == 0
    assert "no residency violations" in capsys.readouterr().out


def test_residency_csv_and_table(
    seeded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich sizes tables to the terminal
    assert run(["audit", "residency", "--catalog", seeded, "-o", "csv"]) == 3
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 and rows[0]["allowed"] == "EU"
    assert run(["audit", "residency", "--catalog", seeded, "-o", "table"]) == 3
    assert "us-east" in capsys.readouterr().out


def test_transfers_filters(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["audit", "transfers", "--catalog", seeded, "-o", "json"]
    assert run(base) == 0
    rows = _json(capsys)
    assert isinstance(rows, list)
    assert [r["id"] for r in rows] == ["t-old", "t-bad", "t-web"]  # oldest first
    assert set(rows[0]) == {
        "id",
        "dataset",
        "object",
        "version",
        "from",
        "to",
        "from_jurisdiction",
        "to_jurisdiction",
        "logical_bytes",
        "wire_bytes",
        "at",
        "outcome",
    }
    assert run([*base, "--since", "24h"]) == 0
    assert [r["id"] for r in _json(capsys)] == ["t-bad", "t-web"]  # type: ignore[union-attr]
    assert run([*base, "--cross-border"]) == 0
    assert [r["id"] for r in _json(capsys)] == ["t-bad", "t-web"]  # type: ignore[union-attr]
    assert run([*base, "--dataset", "corpus/*"]) == 0
    assert [r["id"] for r in _json(capsys)] == ["t-web"]  # type: ignore[union-attr]
    assert run([*base, "--dataset", "ckpt/llama-?0b", "--cross-border"]) == 0
    assert [r["id"] for r in _json(capsys)] == ["t-bad"]  # type: ignore[union-attr]


def test_audit_dataset(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["audit", "dataset", "ckpt/llama-70b", "--catalog", seeded, "-o", "json"]) == 0
    rows = _json(capsys)
    assert isinstance(rows, list)
    assert [(r["object"], r["region"], r["state"]) for r in rows] == [
        ("a", "eu-central", "pending"),
        ("a", "eu-west", "completed"),
        ("b", "eu-central", "pending"),
        ("b", "eu-west", "completed"),
        ("b", "us-east", "completed"),
    ]
    assert rows[0]["digest"] == fake_digest("sha-a")
    assert run(["audit", "dataset", "nope", "--catalog", seeded]) == 1
    assert "dataset 'nope' is not in the catalog" in capsys.readouterr().err


def test_audit_failovers(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["audit", "failovers", "--catalog", seeded, "-o", "json"]) == 0
    rows = _json(capsys)
    assert isinstance(rows, list) and len(rows) == 1
    assert {
        "id",
        "dataset",
        "from",
        "to",
        "epoch",
        "reason",
        "actor",
        "started_at",
        "completed_at",
    } <= set(rows[0])
    assert (rows[0]["from"], rows[0]["to"], rows[0]["epoch"]) == ("eu-west", "eu-central", 7)
    # What the new owner lacked, as the journal has it: an auditor sees which versions.
    assert rows[0]["rpo_versions"] == 1
    assert rows[0]["details"] == {"incomplete_versions": ["k@1.0@eu-west"], "rpo_source": "agents"}
    assert run(["audit", "failovers", "--catalog", seeded, "--since", "1h", "-o", "json"]) == 0
    assert _json(capsys) == []


def test_views_answer_the_same(seeded: str, sql: Any) -> None:
    with sql(seeded) as s:
        kinds = sorted(s.execute(text("SELECT kind FROM residency_violations")).scalars())
        ids = sorted(s.execute(text("SELECT id FROM cross_border_transfers")).scalars())
    assert kinds == ["replica", "transfer"]
    assert ids == ["t-bad", "t-web"]


def test_parse_since() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_since("90m", now=now) == now - timedelta(minutes=90)
    assert parse_since("7d", now=now) == now - timedelta(days=7)
    assert parse_since("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=UTC)
    for bad in ("yesterday", "5 days", "2026-01-01T00:00:00"):
        with pytest.raises(InvalidInputError, match="--since"):
            parse_since(bad)
    # A duration reaching back before the year 1 is one sentence, not an internal error.
    for huge in ("99999999999d", "999999w"):
        with pytest.raises(InvalidInputError, match="reaches back more than"):
            parse_since(huge, now=now)


def test_transfers_glob_like_fallback_gives_the_same_rows(
    seeded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["audit", "transfers", "--catalog", seeded, "-o", "json", "--dataset", "c*/l?ama-70b"]
    assert run(base) == 0
    direct = _json(capsys)
    monkeypatch.setattr("controlplane.catalog.audit.MAX_IN_LIST", 0)
    assert run([*base, "--limit", "1"]) == 0
    assert [r["id"] for r in _json(capsys)] == ["t-old"]  # type: ignore[union-attr]
    assert run(base) == 0
    assert _json(capsys) == direct
    assert [r["id"] for r in direct] == ["t-old", "t-bad"]  # type: ignore[union-attr]
