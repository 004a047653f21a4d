"""`Catalog.record_holdings`, the recorder's one-transaction batch, on SQLite and
PostgreSQL: the last report of a replica stands, the holder overrides the replicator's
state machine, and a bad batch writes nothing."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from harness.digests import fake_digest
from records_helpers import DATASET, REGION
from sqlalchemy import event

from controlplane.catalog.api import Catalog
from controlplane.catalog.errors import CatalogInputError
from controlplane.catalog.records import HeldVersion, Holding, HoldingState, TransferRecord

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _version(key: str, wall_ms: int, content: str = "c") -> HeldVersion:
    return HeldVersion(
        dataset=DATASET,
        key=key,
        version=f"{wall_ms:013d}.00000@eu-west",
        op="put",
        size=1,
        digest=fake_digest(content),
        origin_region="eu-west",
        created_at=AT,
    )


def _holding(v: HeldVersion, state: HoldingState, region: str = REGION) -> Holding:
    return Holding(v.dataset, v.key, v.version, region, state, AT, digest=v.digest, error="lost")


def _states(cat: Catalog, key: str) -> list[tuple[str, str, str]]:
    return [(r.version, r.region, r.state) for r in cat.replica_status(DATASET, key=key)]


def test_the_last_holding_of_a_replica_in_a_batch_stands(cat: Catalog) -> None:
    a, b = _version("a", 1_796_000_000_000), _version("b", 1_796_000_000_000)
    cat.record_holdings(
        [a, b],
        [
            _holding(a, "completed"),
            _holding(a, "failed"),
            _holding(a, "completed"),
            _holding(b, "completed"),
            _holding(b, "removed"),
        ],
    )
    assert _states(cat, "a") == [(a.version, REGION, "completed")]
    assert _states(cat, "b") == []
    cat.record_holdings([a], [_holding(a, "completed")])  # again: nothing changes
    assert _states(cat, "a") == [(a.version, REGION, "completed")]


def test_the_holder_overrides_the_replicators_state(cat: Catalog) -> None:
    a = _version("a", 1_796_000_000_000)
    cat.record_holdings([a], [])
    cat.set_replica_state(DATASET, "a", a.version, "eu-central", "pending")
    cat.record_holdings([], [_holding(a, "completed", "eu-central")])
    [done] = cat.replica_status(DATASET, key="a")
    assert (done.state, done.verified_digest) == ("completed", a.digest)
    # completed is final for the replicator, not for the holder that lost the bytes
    cat.record_holdings([], [_holding(a, "failed", "eu-central")])
    [lost] = cat.replica_status(DATASET, key="a")
    assert (lost.state, lost.last_error, lost.verified_digest) == ("failed", "lost", None)


def test_a_bad_batch_writes_nothing(cat: Catalog) -> None:
    a = _version("a", 1_796_000_000_000)
    cat.record_holdings([a], [_holding(a, "completed")])
    good = _version("good", 1_796_000_000_000)
    other = _version("a", 1_796_000_000_000, content="other")  # same version, new digest
    with pytest.raises(CatalogInputError, match="is registered with digest"):
        cat.record_holdings([good, other], [_holding(good, "completed")])
    assert cat.latest_version(DATASET, "good") is None
    with pytest.raises(CatalogInputError, match="is not registered"):
        cat.record_holdings([], [_holding(good, "completed")])
    cat.record_holdings([], [_holding(good, "removed")])  # forgetting nothing is fine
    with pytest.raises(CatalogInputError, match="holds digest"):
        wrong = Holding(DATASET, "a", a.version, REGION, "completed", AT, digest=fake_digest("x"))
        cat.record_holdings([], [wrong])
    assert _states(cat, "a") == [(a.version, REGION, "completed")]


def test_a_held_version_needs_a_known_digest(cat: Catalog) -> None:
    bad = HeldVersion(DATASET, "k", "1796000000000.00000@eu-west", "put", 1, "d1", "eu-west", AT)
    with pytest.raises(CatalogInputError, match="names no algorithm"):
        cat.record_holdings([bad], [])
    assert cat.latest_version(DATASET, "k") is None


def _transfer(n: int, to_region: str = REGION, tid: str | None = None) -> TransferRecord:
    return TransferRecord(
        id=tid or f"t-{n}",
        dataset=DATASET,
        object=f"k{n}",
        version=f"{1_796_000_000_000 + n:013d}.00000@us-east",
        from_region="us-east",
        to_region=to_region,
        logical_bytes=1024,
        wire_bytes=1000 + n,
        outcome="completed",
        at=AT,
        policy_revision=1,
    )


def test_a_batch_of_transfers_is_judged_and_idempotent(cat: Catalog) -> None:
    batch = [_transfer(n) for n in range(300)] + [_transfer(0, tid="t-0")]  # t-0 twice
    cat.record_holdings([], [], batch)
    cat.record_holdings([], [], batch[:10])  # shipped again: nothing changes
    rows = {r["id"]: r for r in cat.transfers(dataset_glob=DATASET)}
    assert len(rows) == 300
    one = rows["t-7"]
    assert (one["object"], one["from"], one["to"], one["wire_bytes"]) == (
        "k7",
        "us-east",
        REGION,
        1007,
    )
    assert (one["from_jurisdiction"], one["to_jurisdiction"]) == ("US", "EU")
    assert [r["id"] for r in cat.transfers(dataset_glob=DATASET, cross_border=True)][:1]
    assert cat.residency_violations() == []  # EU and US are both in corpus/web's residency


def test_a_transfer_naming_an_unknown_region_fails_its_batch(cat: Catalog) -> None:
    with pytest.raises(CatalogInputError, match="'mars-1' is not in the catalog"):
        cat.record_holdings([], [], [_transfer(1), _transfer(2, to_region="mars-1")])
    assert cat.transfers(dataset_glob=DATASET) == []


def test_a_transfer_is_judged_by_the_residency_of_its_time(cat: Catalog) -> None:
    """The agent journals the jurisdictions and the residency in force when it copied;
    the catalog judges by them, not by the rules when the record ships (the residency
    narrowed, a region relabelled or removed meanwhile)."""
    made_under_eu_only = dataclasses.replace(
        _transfer(1, to_region="us-east", tid="t-narrow"),
        from_jurisdiction="EU",
        to_jurisdiction="US",
        residency=("EU",),
        residency_revision=1,
    )
    to_a_region_removed_since = dataclasses.replace(
        _transfer(2, to_region="mars-1", tid="t-gone"),
        from_jurisdiction="US",
        to_jurisdiction="EU",
        residency=("EU", "US"),
        residency_revision=1,
    )
    # Made after revision 1 was applied, by an agent whose view was older: its rules
    # were no longer in force, so the catalog's stand (EU and US: allowed).
    under_a_lagging_view = dataclasses.replace(
        _transfer(3, tid="t-stale"),
        at=datetime.now(UTC),
        to_jurisdiction="EU",
        residency=("US",),
        residency_revision=0,
    )
    cat.record_holdings(
        [], [], [made_under_eu_only, to_a_region_removed_since, under_a_lagging_view]
    )
    rows = {r["id"]: r for r in cat.transfers(dataset_glob=DATASET)}
    assert rows["t-gone"]["to_jurisdiction"] == "EU"
    # corpus/web allows US now, but the copy was made while only EU was allowed.
    [violation] = cat.residency_violations()
    assert (violation["kind"], violation["region"], violation["allowed"]) == (
        "transfer",
        "us-east",
        ["EU"],
    )


def test_a_batch_of_transfers_costs_a_few_statements(cat: Catalog) -> None:
    """The recorder ships one transfer per object a replicator pushes: per batch, not per
    transfer, statements (a handful each cost most of an agent's CPU)."""
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    engine = cat._engine  # counting what the catalog sends
    event.listen(engine, "before_cursor_execute", count)
    try:
        cat.record_holdings([], [], [_transfer(n) for n in range(200)])
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(cat.transfers(dataset_glob=DATASET)) == 200
    assert len(statements) <= 12, statements
