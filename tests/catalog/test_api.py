"""The catalog write and read API (the contract of issue 5), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.errors import CatalogInputError
from controlplane.catalog.models import ObjectVersion, Replica, Transfer
from controlplane.catalog.records import FailoverRecord, TransferRecord, VersionRef
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files

EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def cat(catalog_url: str) -> Iterator[Catalog]:
    catalog = open_catalog(catalog_url)
    policy, problems = compile_files([EXAMPLE])
    assert policy is not None, problems
    apply_policy(catalog, policy, source="test", publisher=None, applied_by="tester")
    yield catalog
    catalog.close()


def _count(cat: Catalog, model: type) -> int:
    with cat.session() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


def test_regions_and_placements(cat: Catalog) -> None:
    assert [(r.name, r.jurisdiction) for r in cat.list_regions()] == [
        ("eu-central", "EU"),
        ("eu-west", "EU"),
        ("us-east", "US"),
    ]
    placements = cat.list_placements()
    assert [p.dataset for p in placements] == ["ckpt/llama-70b"]
    p = cat.get_placement("ckpt/llama-70b")
    assert p is not None
    assert (p.policy, p.dataset_class, p.home, p.replicas, p.residency) == (
        "checkpoints",
        "critical",
        "eu-west",
        ("eu-central",),
        ("EU",),
    )
    assert p.failover_mode == "automatic" and p.failover_order == ("eu-central",)
    assert p.labels == {"team": "pretrain"}
    assert cat.get_placement("nope") is None


def test_dataset_registered_on_first_write_is_placed(cat: Catalog) -> None:
    cat.register_version("corpus/web", "a.parquet", "v1", "d1", size=10, origin_region="us-east")
    p = cat.get_placement("corpus/web")
    assert p is not None and p.policy == "web-corpus"
    # Nearest allowed regions by RTT from us-east: eu-west (80ms), then eu-central (no link).
    assert p.replicas == ("eu-west", "eu-central")
    cat.register_version("logs/x", "k", "v1", "d")
    assert cat.get_placement("logs/x") is None  # no policy selects it


def test_register_is_idempotent_and_refuses_a_new_digest(cat: Catalog) -> None:
    for _ in range(3):
        cat.register_dataset("ckpt/other")
        cat.register_object("ckpt/other", "shard-0")
        cat.register_version("ckpt/other", "shard-0", "v1", "abc", size=3)
    assert _count(cat, ObjectVersion) == 1
    with pytest.raises(CatalogInputError, match="registered with digest abc, not xyz"):
        cat.register_version("ckpt/other", "shard-0", "v1", "xyz")


def test_replica_states_and_incomplete_versions(cat: Catalog) -> None:
    ds = "ckpt/llama-70b"
    for key in ("a", "b", "c"):
        cat.register_version(ds, key, "v1", f"{key}1")
        cat.set_replica_state(ds, key, "v1", "eu-west", "completed")
    cat.register_version(ds, "a", "v2", "a2")
    cat.set_replica_state(ds, "a", "v1", "eu-central", "completed")
    cat.set_replica_state(ds, "b", "v1", "eu-central", "pending")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "failed")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "completed")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "completed")  # same state: no-op
    # a: latest is v2, never copied; b: pending; c: completed.
    assert cat.incomplete_versions(ds, "eu-central") == [
        VersionRef("a", "v2", "a2"),
        VersionRef("b", "v1", "b1"),
    ]
    assert cat.incomplete_versions(ds, "eu-west") == [VersionRef("a", "v2", "a2")]
    assert _count(cat, Replica) == 6
    with pytest.raises(CatalogInputError, match="not one of pending, completed, failed"):
        cat.set_replica_state(ds, "a", "v1", "eu-west", "done")
    with pytest.raises(CatalogInputError, match="is not registered"):
        cat.set_replica_state(ds, "zz", "v1", "eu-west", "pending")
    with pytest.raises(CatalogInputError, match="region 'mars' is not in the catalog"):
        cat.set_replica_state(ds, "a", "v1", "mars", "pending")


def test_replica_outside_residency_is_marked(cat: Catalog) -> None:
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", "d")
    cat.set_replica_state(ds, "a", "v1", "us-east", "completed")
    cat.set_replica_state(ds, "a", "v1", "eu-central", "completed")
    with cat.session() as s:
        rows = s.execute(
            select(Replica.region, Replica.jurisdiction, Replica.allowed).order_by(Replica.region)
        ).all()
    assert [tuple(r) for r in rows] == [("eu-central", "EU", True), ("us-east", "US", False)]


def _transfer(tid: str, to: str = "eu-central", at: datetime = T0) -> TransferRecord:
    return TransferRecord(
        id=tid,
        dataset="ckpt/llama-70b",
        object="a",
        version="v1",
        from_region="eu-west",
        to_region=to,
        logical_bytes=100,
        wire_bytes=40,
        outcome="completed",
        at=at,
    )


def test_record_transfer_is_idempotent(cat: Catalog) -> None:
    cat.record_transfer(_transfer("t1"))
    cat.record_transfer(_transfer("t1"))
    cat.record_transfer(_transfer("t2", to="us-east"))
    with cat.session() as s:
        rows = s.execute(
            select(
                Transfer.id, Transfer.cross_border, Transfer.allowed, Transfer.to_jurisdiction
            ).order_by(Transfer.id)
        ).all()
    assert [tuple(r) for r in rows] == [("t1", False, True, "EU"), ("t2", True, False, "US")]


def _failover(fid: str, started: datetime) -> FailoverRecord:
    return FailoverRecord(
        id=fid,
        dataset="ckpt/llama-70b",
        from_region="eu-west",
        to_region="eu-central",
        epoch=42,
        kind="failover",
        reason="region lost",
        actor="ops",
        detected_at=started,
        started_at=started,
        completed_at=started + timedelta(seconds=3),
        rpo_versions=1,
        details="{}",
    )


def test_failover_journal(cat: Catalog) -> None:
    cat.append_failover(_failover("f2", T0 + timedelta(hours=1)))
    cat.append_failover(_failover("f1", T0))
    cat.append_failover(_failover("f1", T0))  # idempotent
    got = cat.list_failovers()
    assert [f.id for f in got] == ["f1", "f2"]  # newest last
    assert got[0] == _failover("f1", T0)  # round-trips, timezone-aware
    assert [f.id for f in cat.list_failovers(since=T0 + timedelta(minutes=30))] == ["f2"]
    bad = FailoverRecord(**{**_failover("f3", T0).__dict__, "kind": "oops"})  # type: ignore[arg-type]
    with pytest.raises(CatalogInputError, match="failover kind"):
        cat.append_failover(bad)


def test_concurrent_idempotent_writes_from_threads(cat: Catalog) -> None:
    """Eight threads racing on the same natural keys and ids leave exactly one row each."""
    errors: list[Exception] = []

    def work() -> None:
        try:
            for i in range(10):
                cat.register_version("corpus/race", f"k{i}", "v1", f"d{i}")
                cat.set_replica_state("corpus/race", f"k{i}", "v1", "eu-west", "completed")
                cat.record_transfer(_transfer(f"race-{i}"))
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert _count(cat, ObjectVersion) == 10
    assert _count(cat, Replica) == 10
    assert _count(cat, Transfer) == 10
