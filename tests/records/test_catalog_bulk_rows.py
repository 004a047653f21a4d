"""The recorder's bulk rows (controlplane/catalog/holdings.py, unnest.py): on PostgreSQL a
batch's rows of a table go as ONE statement over arrays, every value lands in its own
column whatever the order of the row's keys, and on both backends the rows read back
exactly as sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from records_helpers import DATASET, REGION
from sqlalchemy import event, select

from controlplane.catalog import holdings
from controlplane.catalog.api import Catalog
from controlplane.catalog.audit import rfc3339
from controlplane.catalog.models import ObjectVersion, Replica, Transfer
from controlplane.catalog.records import HeldVersion, Holding, TransferRecord
from controlplane.catalog.unnest import UnnestForm, unnest_form

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _at(n: int) -> datetime:
    """A time of its own per row (a mix-up between rows must show), some rows alike."""
    return AT + timedelta(minutes=n // 3)


def _batch(n: int) -> tuple[list[HeldVersion], list[Holding], list[TransferRecord]]:
    versions = [
        HeldVersion(
            dataset=DATASET,
            key=f"k{i}",
            version=f"{1_796_000_000_000 + i:013d}.00000@us-east",
            op="put",
            size=i,
            digest=f"blake3:{i:064x}",
            origin_region="us-east",
            created_at=AT + timedelta(seconds=i),
            set_id="s1" if i % 2 else None,
        )
        for i in range(n)
    ]
    held = [
        Holding(v.dataset, v.key, v.version, REGION, "completed", _at(n), digest=v.digest)
        for n, v in enumerate(versions)
    ]
    transfers = [
        TransferRecord(
            id=f"t-{i}",
            dataset=DATASET,
            object=v.key,
            version=v.version,
            from_region="us-east",
            to_region=REGION,
            logical_bytes=v.size,
            wire_bytes=1000 + i,
            outcome="completed",
            at=_at(i),
            policy_revision=7,
        )
        for i, v in enumerate(versions)
    ]
    return versions, held, transfers


def test_a_batch_reads_back_as_sent_and_goes_as_one_statement_per_table(cat: Catalog) -> None:
    sent: list[tuple[str, bool]] = []

    def note(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool) -> None:
        sent.append((statement, many))

    versions, held, transfers = _batch(60)
    engine = cat._engine  # watching what the catalog sends
    event.listen(engine, "before_cursor_execute", note)
    try:
        cat.record_holdings(versions, held, transfers)
    finally:
        event.remove(engine, "before_cursor_execute", note)

    for v in versions:
        [row] = cat.replica_status(DATASET, key=v.key)
        assert (row.version, row.region, row.state, row.verified_digest) == (
            v.version,
            REGION,
            "completed",
            v.digest,
        )
    stored = {r["id"]: r for r in cat.transfers(dataset_glob=DATASET)}
    assert len(stored) == 60
    t = stored["t-41"]
    assert (t["object"], t["from"], t["to"], t["wire_bytes"], t["logical_bytes"]) == (
        "k41",
        "us-east",
        REGION,
        1041,
        41,
    )
    assert (t["from_jurisdiction"], t["to_jurisdiction"]) == ("US", "EU")
    assert all(stored[f"t-{i}"]["at"] == rfc3339(_at(i)) for i in range(60)), stored
    with cat._engine.connect() as conn:
        times = conn.execute(
            select(ObjectVersion.version, ObjectVersion.created_at, Replica.updated_at).join(
                Replica, Replica.version_id == ObjectVersion.id
            )
        ).all()
    want = {v.version: (v.created_at, _at(n)) for n, v in enumerate(versions)}
    assert {r[0]: (_utc(r[1]), _utc(r[2])) for r in times} == want
    tables = ("objects", "object_versions", "replicas", "transfers")
    inserts = [
        (s, many) for s, many in sent if s.startswith(tuple(f"INSERT INTO {t} " for t in tables))
    ]
    assert len(inserts) >= 4, sent
    if engine.dialect.name == "postgresql":
        # one statement per table, over arrays, none row by row
        assert [many for _, many in inserts] == [False] * 4, inserts
        assert all("unnest(" in s for s, _ in inserts), inserts


def test_rows_whose_keys_are_not_in_table_order_land_in_their_columns(cat: Catalog) -> None:
    """A row's keys in another order than the table's columns (the compiled INSERT lists
    the table's order): each value still lands in its own column, also two columns of
    one type (from_region, to_region) that a mix-up would swap silently."""
    row = holdings.transfer_row(_batch(1)[2][0], "US", "EU", True, ["EU", "US"])
    rows = [dict(reversed(list(row.items()))), dict(reversed(list({**row, "id": "t-9"}.items())))]
    assert list(rows[0]) != [c.name for c in Transfer.__table__.c if c.name in row]
    with cat._engine.begin() as conn:
        holdings._execute_many(
            conn,
            "test: reversed transfer rows",
            lambda: holdings._insert(cat.dialect, Transfer.__table__),
            Transfer.__table__,
            rows,
        )
    with cat._engine.connect() as conn:
        got = conn.execute(
            select(Transfer.from_region, Transfer.to_region, Transfer.residency, Transfer.at)
            .where(Transfer.id.in_(["t-0", "t-9"]))
            .order_by(Transfer.id)
        ).all()
    assert [tuple(r[:3]) for r in got] == [("us-east", REGION, ["EU", "US"])] * 2
    assert {r[3].astimezone(UTC) if r[3].tzinfo else r[3].replace(tzinfo=UTC) for r in got} == {AT}


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def test_equal_times_of_different_instants_are_processed_apart() -> None:
    """In a repeated hour two times differ only in `fold`: equal to Python, yet two
    instants, each of which must be written as itself."""
    zone = ZoneInfo("America/New_York")
    first = datetime(2026, 11, 1, 1, 30, tzinfo=zone)
    second = first.replace(fold=1)
    assert first == second and first.utcoffset() != second.utcoffset()
    assert holdings._processed([first, second, first], lambda v: v.astimezone(UTC)) == [
        datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
        datetime(2026, 11, 1, 6, 30, tzinfo=UTC),
        datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
    ]


def test_a_json_none_is_sent_as_sqlalchemy_binds_it() -> None:
    """JSON 'null' unless the column type says none_as_null (then SQL NULL), whatever
    the batch's size (a single row goes the usual way, which does the same)."""
    form = UnnestForm("-", {0: False, 1: True})
    assert form.parameters([[None, ["EU"]], [None, {"a": 1}], [1, 2]]) == {
        "p0": ["null", '["EU"]'],
        "p1": [None, '{"a": 1}'],
        "p2": [1, 2],
    }


def test_the_one_statement_form_keeps_the_conflict_clause_and_the_row_order() -> None:
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    table = Replica.__table__
    order = ("state", "version_id", "region", "jurisdiction", "allowed", "updated_at")
    insert = postgresql.insert(table)
    compiled = insert.on_conflict_do_update(
        index_elements=["version_id", "region"], set_={"state": insert.excluded.state}
    ).compile(dialect=dialect, column_keys=list(order))
    form = unnest_form(compiled.string, table, order, dialect)
    assert form is not None
    assert form.sql.startswith(
        "INSERT INTO replicas (state, version_id, region, jurisdiction, allowed, updated_at) "
        "SELECT u.c0, u.c1, u.c2, u.c3, u.c4, u.c5 FROM unnest(CAST(%(p0)s AS TEXT[]), "
        "CAST(%(p1)s AS BIGINT[])"
    ), form.sql
    assert form.sql.endswith(
        "ON CONFLICT (version_id, region) DO UPDATE SET state = excluded.state"
    ), form.sql
    assert "RETURNING" not in form.sql
