"""The catalog write and read API (the contract of issue 5), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harness.digests import fake_digest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.errors import CatalogError, CatalogInputError, CatalogUnavailableError
from controlplane.catalog.models import ObjectVersion, Replica, Transfer
from controlplane.catalog.records import CopyRecord, FailoverRecord, TransferRecord
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files
from controlplane.policy.placer import place

SqlSession = Callable[[str], AbstractContextManager[Session]]  # the `sql` fixture
EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def cat(catalog_url: str) -> Iterator[Catalog]:
    catalog = open_catalog(catalog_url, placer=place)
    policy, problems = compile_files([EXAMPLE])
    assert policy is not None, problems
    apply_policy(catalog, policy, source="test", publisher=None, applied_by="tester")
    yield catalog
    catalog.close()


def _count(cat: Catalog, model: type, sql: SqlSession) -> int:
    with sql(cat.url) as s:
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
    cat.register_version(
        "corpus/web", "a.parquet", "v1", fake_digest("d1"), size=10, origin_region="us-east"
    )
    p = cat.get_placement("corpus/web")
    assert p is not None and p.policy == "web-corpus"
    # Nearest allowed regions by RTT from us-east: eu-west (80ms), then eu-central (no link).
    assert p.replicas == ("eu-west", "eu-central")
    cat.register_version("logs/x", "k", "v1", fake_digest("d"))
    assert cat.get_placement("logs/x") is None  # no policy selects it


def test_register_is_idempotent_and_refuses_a_new_digest(cat: Catalog, sql: SqlSession) -> None:
    for _ in range(3):
        cat.register_dataset("ckpt/other")
        cat.register_object("ckpt/other", "shard-0")
        cat.register_version("ckpt/other", "shard-0", "v1", fake_digest("abc"), size=3)
    assert _count(cat, ObjectVersion, sql) == 1
    with pytest.raises(
        CatalogInputError,
        match=f"registered with digest {fake_digest('abc')}, not {fake_digest('xyz')}",
    ):
        cat.register_version("ckpt/other", "shard-0", "v1", fake_digest("xyz"))


def test_replica_states_and_incomplete_versions(cat: Catalog, sql: SqlSession) -> None:
    ds = "ckpt/llama-70b"
    for key in ("a", "b", "c"):
        cat.register_version(ds, key, "v1", fake_digest(f"{key}1"))
        cat.set_replica_state(ds, key, "v1", "eu-west", "completed", digest=fake_digest(f"{key}1"))
    cat.register_version(ds, "a", "v2", fake_digest("a2"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "completed", digest=fake_digest("a1"))
    cat.set_replica_state(ds, "b", "v1", "eu-central", "pending")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "failed", error="timeout")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "pending")
    cat.set_replica_state(ds, "c", "v1", "eu-central", "completed", digest=fake_digest("c1"))
    cat.set_replica_state(
        ds, "c", "v1", "eu-central", "completed", digest=fake_digest("c1")
    )  # no-op
    # a: latest is v2, never copied; b: pending; c: completed.
    got = cat.incomplete_versions(ds, "eu-central")
    assert [(v.object, v.version, v.digest, v.op) for v in got] == [
        ("a", "v2", fake_digest("a2"), "put"),
        ("b", "v1", fake_digest("b1"), "put"),
    ]
    assert [(v.object, v.version) for v in cat.incomplete_versions(ds, "eu-west")] == [("a", "v2")]
    assert _count(cat, Replica, sql) == 6
    with pytest.raises(CatalogInputError, match="not one of pending, completed, failed"):
        cat.set_replica_state(ds, "a", "v1", "eu-west", "done")
    with pytest.raises(CatalogInputError, match="is not registered"):
        cat.set_replica_state(ds, "zz", "v1", "eu-west", "pending")
    with pytest.raises(CatalogInputError, match="region 'mars' is not in the catalog"):
        cat.set_replica_state(ds, "a", "v1", "mars", "pending")


def test_replica_outside_residency_is_marked(cat: Catalog, sql: SqlSession) -> None:
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", fake_digest("d"))
    cat.set_replica_state(ds, "a", "v1", "us-east", "completed", digest=fake_digest("d"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "completed", digest=fake_digest("d"))
    with sql(cat.url) as s:
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


def test_record_transfer_is_idempotent(cat: Catalog, sql: SqlSession) -> None:
    cat.record_transfer(_transfer("t1"))
    cat.record_transfer(_transfer("t1"))
    cat.record_transfer(_transfer("t2", to="us-east"))
    with sql(cat.url) as s:
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


def test_a_movers_own_row_replaces_one_rebuilt_late(cat: Catalog) -> None:
    """Another controller rebuilt the row of a move whose mover seemed gone (it held
    it deferred through a catalog outage): the mover's row, with its RPO exposure,
    replaces the rebuilt one; a rebuilt row never replaces a mover's."""
    rebuilt = dataclasses.replace(
        _failover("m1", T0), rpo_versions=0, details='{"backfilled": true}'
    )
    own = dataclasses.replace(_failover("m1", T0), rpo_versions=3, details='{"rpo": 3}')
    cat.append_failover(rebuilt)
    cat.append_failover(own)
    [row] = cat.list_failovers()
    assert (row.rpo_versions, row.details_json) == (3, {"rpo": 3})
    cat.append_failover(rebuilt)  # late again: the mover's row stays
    cat.append_failover(dataclasses.replace(own, rpo_versions=9))  # a repeat: ignored
    [row] = cat.list_failovers()
    assert (row.rpo_versions, row.details_json) == (3, {"rpo": 3})


def test_concurrent_idempotent_writes_from_threads(cat: Catalog, sql: SqlSession) -> None:
    """Eight threads racing on the same natural keys and ids leave exactly one row each."""
    errors: list[Exception] = []

    def work() -> None:
        try:
            for i in range(10):
                cat.register_version("corpus/race", f"k{i}", "v1", fake_digest(f"d{i}"))
                cat.set_replica_state(
                    "corpus/race",
                    f"k{i}",
                    "v1",
                    "eu-west",
                    "completed",
                    digest=fake_digest(f"d{i}"),
                )
                cat.record_transfer(_transfer(f"race-{i}"))
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert _count(cat, ObjectVersion, sql) == 10
    assert _count(cat, Replica, sql) == 10
    assert _count(cat, Transfer, sql) == 10


def _hlc(wall_ms: int, logical: int = 0, region: str = "eu-west") -> str:
    return f"{wall_ms:013d}.{logical:05d}@{region}"


def test_latest_is_the_highest_hlc_not_the_last_row(cat: Catalog) -> None:
    """A replayed older version registered after a newer one does not become latest,
    and a tombstone is a version: when it is newest, it is what a region must apply."""
    ds = "corpus/web"
    newer, older = _hlc(1_764_579_200_000), _hlc(1_764_579_100_000, 7, "us-east")
    cat.register_version(ds, "k", newer, fake_digest("bb"), origin_region="eu-west")
    cat.register_version(ds, "k", older, fake_digest("aa"), origin_region="us-east")
    latest = cat.latest_version(ds, "k")
    assert latest is not None and latest.version == newer and latest.hlc == newer
    # the region tie-break is byte-wise: "eu-west" < "us-east" at the same (wall, logical)
    tie_a, tie_b = _hlc(1_764_579_300_000, 0, "us-east"), _hlc(1_764_579_300_000, 0, "eu-west")
    cat.register_version(ds, "t", tie_a, fake_digest("01"))
    cat.register_version(ds, "t", tie_b, fake_digest("02"))
    assert [v.version for v in cat.incomplete_versions(ds, "eu-central")] == [newer, tie_a]
    tomb = _hlc(1_764_579_400_000)
    cat.register_version(ds, "k", tomb, "", op="delete", origin_region="eu-west")
    got = {v.object: v for v in cat.incomplete_versions(ds, "eu-central")}
    assert got["k"].version == tomb and got["k"].op == "delete"
    cat.set_replica_state(ds, "k", tomb, "eu-central", "completed")  # a tombstone needs no digest
    assert "k" not in {v.object for v in cat.incomplete_versions(ds, "eu-central")}
    with pytest.raises(CatalogInputError, match="version op 'move'"):
        cat.register_version(ds, "k", _hlc(1_764_579_500_000), "", op="move")
    with pytest.raises(CatalogInputError, match=r"v9 of corpus/web/k: malformed HLC"):
        cat.register_version(ds, "k", "v9", fake_digest("d"), hlc="12.3@x")


def test_lag_is_measured_from_the_hlc_wall_time(cat: Catalog) -> None:
    ds = "corpus/web"
    wall = 1_764_579_000_000
    cat.register_version(ds, "a", _hlc(wall + 5_000), fake_digest("aa"), origin_region="eu-west")
    cat.register_version(ds, "b", _hlc(wall), fake_digest("bb"), origin_region="eu-west")
    at = cat.oldest_incomplete_at(ds, ["eu-west", "eu-central"])
    assert at == datetime.fromtimestamp(wall / 1000, UTC)  # b, the older, not the last written
    cat.set_replica_state(ds, "b", _hlc(wall), "eu-central", "completed", digest=fake_digest("bb"))
    at = cat.oldest_incomplete_at(ds, ["eu-west", "eu-central"])
    assert at == datetime.fromtimestamp((wall + 5_000) / 1000, UTC)


def test_replica_transitions_are_checked(cat: Catalog) -> None:
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", fake_digest("aa"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "pending")
    with pytest.raises(CatalogInputError, match="cannot complete without the digest"):
        cat.set_replica_state(ds, "a", "v1", "eu-central", "completed")
    with pytest.raises(
        CatalogInputError, match=f"verified digest {fake_digest('zz')}, but the version's"
    ):
        cat.set_replica_state(ds, "a", "v1", "eu-central", "completed", digest=fake_digest("zz"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "failed", error="peer reset")
    with pytest.raises(CatalogInputError, match="is failed and cannot become completed"):
        cat.set_replica_state(ds, "a", "v1", "eu-central", "completed", digest=fake_digest("aa"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "pending")
    cat.set_replica_state(ds, "a", "v1", "eu-central", "completed", digest=fake_digest("aa"))
    with pytest.raises(CatalogInputError, match="is completed and cannot become pending"):
        cat.set_replica_state(ds, "a", "v1", "eu-central", "pending")
    (status,) = cat.replica_status(ds, key="a", region="eu-central")
    assert status.state == "completed" and status.verified_digest == fake_digest("aa")
    assert status.attempts == 1 and status.last_error == "peer reset"
    assert status.attempted_at is not None


def test_holders_and_replica_status(cat: Catalog) -> None:
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", fake_digest("aa"))
    cat.set_replica_state(ds, "a", "v1", "eu-west", "completed", digest=fake_digest("aa"))
    cat.set_replica_state(ds, "a", "v1", "eu-central", "failed", error="disk full")
    assert cat.holders(ds, "a", "v1") == ["eu-west"]
    assert cat.holders(ds, "a", "v9") == []
    failed = cat.replica_status(ds, states=["failed"])
    assert [(r.object, r.region, r.last_error) for r in failed] == [
        ("a", "eu-central", "disk full")
    ]


def _copy(cid: str, state: str = "completed", digest: str | None = fake_digest("aa")) -> CopyRecord:
    return CopyRecord(
        id=cid,
        dataset="ckpt/llama-70b",
        object="a",
        version="v1",
        from_region="eu-west",
        to_region="eu-central",
        state=state,  # type: ignore[arg-type]
        logical_bytes=1000,
        wire_bytes=120,
        at=T0,
        verified_digest=digest,
        error=None if state == "completed" else "reset by peer",
    )


def test_record_copy_writes_replica_and_transfer_together_once(
    cat: Catalog, sql: SqlSession
) -> None:
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", fake_digest("aa"))
    assert cat.record_copy(_copy("c1", "failed", None)) is True
    assert cat.record_copy(_copy("c1", "failed", None)) is False  # the same copy again
    cat.set_replica_state(ds, "a", "v1", "eu-central", "pending")
    assert cat.record_copy(_copy("c2")) is True
    assert cat.holders(ds, "a", "v1") == ["eu-central"]
    assert _count(cat, Transfer, sql) == 2
    # a bad digest refuses the whole copy: neither the replica nor the transfer is written
    cat.register_version(ds, "b", "v1", fake_digest("bb"))
    bad = CopyRecord(**{**_copy("c3").__dict__, "object": "b"})
    with pytest.raises(CatalogInputError, match=f"verified digest {fake_digest('aa')}"):
        cat.record_copy(bad)
    assert _count(cat, Transfer, sql) == 2
    assert cat.replica_status(ds, key="b") == []


def test_sql_errors_are_translated(cat: Catalog, sql: SqlSession) -> None:
    """No SQLAlchemy error leaves the catalog: a broken schema is a non-retriable
    CatalogError, an unreachable server a retriable CatalogUnavailableError."""
    with sql(cat.url) as s:
        s.execute(text("DROP VIEW residency_violations"))
        s.commit()
    with pytest.raises(CatalogError, match=r"the catalog at .* failed") as info:
        cat.residency_violations()
    assert not info.value.retriable
    assert not isinstance(info.value.__cause__, CatalogError)  # the SQL error is the cause
    from controlplane.catalog.api import Catalog as CatalogClass
    from controlplane.catalog.engine import make_engine

    dead = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    gone = CatalogClass(make_engine(dead), dead)
    with pytest.raises(CatalogUnavailableError, match="is unavailable") as down:
        gone.list_regions()
    assert down.value.retriable
    gone.close()


def test_new_dataset_without_a_placer_is_refused(catalog_url: str) -> None:
    """Fail closed: a catalog that cannot place a new dataset does not register it
    unplaced (which would leave its copies unjudged)."""
    with open_catalog(catalog_url, placer=place) as placed:
        policy, _ = compile_files([EXAMPLE])
        assert policy is not None
        apply_policy(placed, policy, source="test", publisher=None, applied_by="tester")
    with (
        open_catalog(catalog_url) as bare,
        pytest.raises(CatalogInputError, match="opened without a placer"),
    ):
        bare.register_version("corpus/new", "k", "v1", fake_digest("d"))


def test_record_copy_races_record_once(cat: Catalog) -> None:
    """Eight threads recording the same copy: exactly one records it, one attempt counts."""
    ds = "ckpt/llama-70b"
    cat.register_version(ds, "a", "v1", fake_digest("aa"))
    wins: list[bool] = []
    errors: list[Exception] = []

    def work() -> None:
        try:
            wins.append(cat.record_copy(_copy("race", "failed", None)))
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(wins) == [False] * 7 + [True]
    (status,) = cat.replica_status(ds, key="a")
    assert status.attempts == 1 and status.state == "failed"


def test_copies_of_an_unplaced_dataset_are_outside_residency(cat: Catalog) -> None:
    """Fail closed: no applied policy places `logs/x`, so no residency admits its copy."""
    cat.register_version("logs/x", "k", "v1", fake_digest("aa"))
    assert cat.get_placement("logs/x") is None
    cat.set_replica_state("logs/x", "k", "v1", "eu-west", "completed", digest=fake_digest("aa"))
    found = [(v["dataset"], v["region"]) for v in cat.residency_violations()]
    assert ("logs/x", "eu-west") in found


def test_a_version_is_registered_once_as_what_it_is(cat: Catalog) -> None:
    ds, hlc = "corpus/web", _hlc(1_764_579_000_000)
    cat.register_version(ds, "k", hlc, fake_digest("aa"))
    with pytest.raises(CatalogInputError, match="registered as a put"):
        cat.register_version(ds, "k", hlc, "", op="delete")
    with pytest.raises(CatalogInputError, match="is HLC text, so its HLC cannot be"):
        cat.register_version(ds, "k", hlc, fake_digest("aa"), hlc=_hlc(1_764_579_000_001))
    with pytest.raises(CatalogInputError, match=r"a delete \(a tombstone\), which has no digest"):
        cat.register_version(ds, "k", _hlc(1_764_579_000_002), fake_digest("aa"), op="delete")


@pytest.mark.parametrize(
    ("digest", "why"),
    [
        ("d1", "names no algorithm"),
        ("sha256:" + "a" * 64, "algorithm 'sha256' is not known"),
        ("blake3:aa", "has 2 hex digits, not 64"),
        ("blake3:" + "A" * 64, "is not lower-case hexadecimal"),
        ("", "names no algorithm"),
    ],
)
def test_a_put_needs_a_digest_of_a_known_algorithm(cat: Catalog, digest: str, why: str) -> None:
    with pytest.raises(CatalogInputError, match=f"version v1 of corpus/web/k: .*{why}"):
        cat.register_version("corpus/web", "k", "v1", digest)
    assert cat.latest_version("corpus/web", "k") is None  # nothing half-written


def test_lag_counts_from_the_oldest_version_not_yet_completed(cat: Catalog) -> None:
    """A region that completed v1 of k, then nothing, lags from v2 even when v3 is latest."""
    ds, wall = "corpus/web", 1_764_579_000_000
    for n in range(3):
        cat.register_version(
            ds, "k", _hlc(wall + n * 1000), fake_digest(f"0{n}"), origin_region="eu-west"
        )
    cat.set_replica_state(ds, "k", _hlc(wall), "eu-central", "completed", digest=fake_digest("00"))
    at = cat.oldest_incomplete_at(ds, ["eu-central"])
    assert at == datetime.fromtimestamp((wall + 1000) / 1000, UTC)
    # completing the latest makes the older gaps moot: the region is up to date
    cat.set_replica_state(
        ds, "k", _hlc(wall + 2000), "eu-central", "completed", digest=fake_digest("02")
    )
    assert cat.oldest_incomplete_at(ds, ["eu-central"]) is None
    # the origin itself never lags behind its own writes
    assert cat.oldest_incomplete_at(ds, ["eu-west"]) is None


def test_the_origin_lags_behind_its_own_version_only_once_its_bytes_were_lost_there(
    cat: Catalog,
) -> None:
    """Startup repair records a version whose bytes it found lost as its region's replica
    `failed`: only a fetch from another region brings it back, so it lags there (as
    `replication status` counts it); a version made there and held there does not."""
    ds, wall = "corpus/web", 1_764_579_000_000
    held, lost = _hlc(wall), _hlc(wall + 1000)
    cat.register_version(ds, "held", held, fake_digest("00"), origin_region="eu-west")
    cat.set_replica_state(ds, "held", held, "eu-west", "completed", digest=fake_digest("00"))
    cat.register_version(ds, "lost", lost, fake_digest("01"), origin_region="eu-west")
    assert cat.oldest_incomplete_at(ds, ["eu-west"]) is None  # its record is on its way
    cat.set_replica_state(ds, "lost", lost, "eu-west", "failed", error="bytes lost in eu-west")
    at = cat.oldest_incomplete_at(ds, ["eu-west"])
    assert at == datetime.fromtimestamp((wall + 1000) / 1000, UTC)
    # fetched back from a region that holds it
    cat.set_replica_state(ds, "lost", lost, "eu-west", "pending")
    cat.set_replica_state(ds, "lost", lost, "eu-west", "completed", digest=fake_digest("01"))
    assert cat.oldest_incomplete_at(ds, ["eu-west"]) is None
    # An older version lost under a newer one held there: nothing to fetch, no lag.
    older, newer = _hlc(wall + 2000), _hlc(wall + 3000)
    cat.register_version(ds, "k", older, fake_digest("02"), origin_region="eu-west")
    cat.set_replica_state(ds, "k", older, "eu-west", "failed", error="bytes lost in eu-west")
    cat.register_version(ds, "k", newer, fake_digest("03"), origin_region="eu-west")
    cat.set_replica_state(ds, "k", newer, "eu-west", "completed", digest=fake_digest("03"))
    assert cat.oldest_incomplete_at(ds, ["eu-west"]) is None
