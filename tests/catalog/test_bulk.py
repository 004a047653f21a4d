"""Bulk loading reads back like API writes; the benchmark runs end to end at a tiny scale."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Index, inspect

from controlplane.catalog.api import open_catalog
from controlplane.catalog.models import Base

BENCH = Path(__file__).parents[2] / "benchmarks"


def test_bulk_rows_read_back_like_api_rows(catalog_url: str, sql: Any) -> None:
    cat = open_catalog(catalog_url)
    try:
        when = datetime(2026, 3, 1, 12, 30, 0, tzinfo=UTC)
        cat.bulk_load("regions", ["name", "jurisdiction"], [("eu-west", "EU")])
        cat.bulk_load(
            "failovers",
            ["id", "dataset", "from_region", "to_region", "epoch", "kind", "reason", "actor",
             "detected_at", "started_at", "completed_at", "rpo_versions", "details"],
            [("f1", "d", "a", "b", 3, "failover", "r", "x", None, when, when, 0, ""),
             ("f2", "d", "a", "b", 4, "drain", "r", "x", when, when + timedelta(hours=1), None,
              2, "")],
            defer_checks=True,
        )  # fmt: skip
        cat.after_load(["regions", "failovers"])
        got = cat.list_failovers(since=when + timedelta(minutes=1))
        assert [f.id for f in got] == ["f2"]
        assert got[0].detected_at == when and got[0].completed_at is None
        assert [r.name for r in cat.list_regions()] == ["eu-west"]
        # Deferred indexes are all back.
        with sql(cat.url) as conn:
            names = {ix["name"] for ix in inspect(conn.connection()).get_indexes("failovers")}
        want = {
            ix.name for ix in Base.metadata.tables["failovers"].indexes if isinstance(ix, Index)
        }
        assert want <= names
    finally:
        cat.close()


def test_bulk_load_refuses_broken_foreign_keys_and_loads_nothing(
    catalog_url: str, sql: Any
) -> None:
    cat = open_catalog(catalog_url)
    try:
        with pytest.raises(Exception, match=r"(?i)foreign"):
            cat.bulk_load("objects", ["id", "dataset", "key"], [(1, "missing", "k")],
                      defer_checks=True)  # fmt: skip
        with sql(cat.url) as s:
            assert s.execute(Base.metadata.tables["objects"].select()).all() == []
    finally:
        cat.close()


def test_deferred_load_refuses_duplicate_keys_and_loads_nothing(catalog_url: str, sql: Any) -> None:
    """Keys dropped for a deferred load (PostgreSQL) come back, and refuse duplicates."""
    cat = open_catalog(catalog_url)
    row = ("t1", "d", "o", "v", "a", "b", "EU", "EU", 1, 1, None, "completed", False, True,
           ["EU"], datetime(2026, 3, 1, tzinfo=UTC))  # fmt: skip
    columns = [c.name for c in Base.metadata.tables["transfers"].columns]
    try:
        with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
            cat.bulk_load("transfers", columns, [row, row], defer_checks=True)
        with sql(cat.url) as s:
            assert s.execute(Base.metadata.tables["transfers"].select()).all() == []
        assert cat.bulk_load("transfers", columns, [row], defer_checks=True) == 1
        with sql(cat.url) as conn:
            keys = inspect(conn.connection()).get_pk_constraint("transfers")
        assert keys["name"] == "pk_transfers" and keys["constrained_columns"] == ["id"]
        with pytest.raises(Exception, match=r"(?i)duplicate|unique"):
            cat.bulk_load("transfers", columns, [row])  # the key is back
    finally:
        cat.close()


def test_benchmark_runs_at_tiny_scale(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every audit finds exactly the planted violations (timings are not asserted here)."""
    sys.path.insert(0, str(BENCH))
    try:
        import catalog_bench
    finally:
        sys.path.remove(str(BENCH))
    backend = "postgresql" if catalog_url.startswith("postgresql") else "sqlite"
    results = catalog_bench.bench_backend(
        backend, catalog_url, catalog_bench.shape_for(0.002), lambda _msg: None
    )
    residency = next(r for r in results if r.measure == "audit residency")
    assert residency.rows == catalog_bench.PLANTED_REPLICAS + catalog_bench.PLANTED_TRANSFERS
    incomplete = next(r for r in results if r.measure == "Catalog.incomplete_versions")
    assert incomplete.note == f"expected {incomplete.rows}"
