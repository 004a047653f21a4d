"""Bulk loading into the catalog: COPY on PostgreSQL, executemany on SQLite.

For imports and benchmarks, not for the online write path (which is `Catalog`).
Rows are tuples in the order of `columns`; Python values are converted the way the
ORM would store them (UTC timestamps, booleans, JSON lists), so rows loaded here
read back exactly like rows written through the API. Unlike the API, timestamps may
be naive, and are then taken as UTC (formatting aware ones costs a third of the
SQLite load). The caller computes the
denormalised columns (`replicas.jurisdiction/allowed`, `transfers.cross_border/
allowed`) with the same rule the API uses.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Engine,
    ForeignKeyConstraint,
    Index,
    PrimaryKeyConstraint,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import AddConstraint, CreateIndex

from controlplane.catalog.models import Base
from controlplane.catalog.types import UTCDateTime

BATCH_ROWS = 50_000
LOAD_CACHE_KIB = 256 * 1024
SERIAL_TABLES = frozenset({"objects", "object_versions", "replicas", "policy_revisions"})
_IDENT_OK = frozenset("abcdefghijklmnopqrstuvwxyz_0123456789")


def _ident(name: str) -> str:
    if not name or not set(name) <= _IDENT_OK:
        raise ValueError(f"{name!r} is not a plain lower-case SQL identifier")
    return name


def _sqlite_time(value: datetime) -> str:
    """SQLAlchemy's SQLite DATETIME storage: UTC, no zone, always with microseconds."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


def _pg_time(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _json_text(value: Any) -> str:
    return json.dumps(value)


_PG_TYPES = {
    "BIGINT": "int8",
    "INTEGER": "int4",
    "BOOLEAN": "bool",
    "TEXT": "text",
    # JSON goes as its text: binary json and text share one wire form, and the rows
    # arrive already serialised (memoised, since bulk rows repeat the same lists).
    "JSON": "text",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
}


def _pg_type(column: Column[Any], dialect: Dialect) -> str:
    """The PostgreSQL type name psycopg's binary COPY needs for a column."""
    name = str(column.type.compile(dialect=dialect)).upper()
    if name.startswith("VARCHAR"):
        return "varchar"
    return _PG_TYPES[name]


def _converter(column: Column[Any], dialect: str) -> Callable[[Any], Any] | None:
    """How to turn a column's Python values into driver values (None: as they are)."""
    kind = column.type
    if isinstance(kind, JSON):
        return _json_text
    if isinstance(kind, UTCDateTime):
        return _sqlite_time if dialect == "sqlite" else _pg_time
    return None  # bool is an int, which SQLite stores as its BOOLEAN


_ISO = operator.methodcaller("isoformat", " ", "microseconds")
_NAIVE_LEN = len("2026-01-01 00:00:00.000000")


def _by_identity(
    values: tuple[Any, ...], conv: Callable[[Any], Any], *, always: bool
) -> tuple[Any, ...] | None:
    """Each value converted once per distinct object of the batch (NULL stays NULL).

    Bulk rows often share objects (one residency list, one timestamp for a whole
    table), so the memo is keyed by object identity, which is safe here: the batch
    keeps every value alive while it is converted. Every step maps in C. Returns None,
    unless `always`, when fewer than half of the values repeat (the memo would not pay).
    """
    by_id = dict(zip(map(id, values), values, strict=True))
    if not always and len(by_id) * 2 > len(values):
        return None
    memo = {key: (None if obj is None else conv(obj)) for key, obj in by_id.items()}
    return tuple(map(memo.__getitem__, map(id, values)))


def _convert_column(values: tuple[Any, ...], conv: Callable[[Any], Any]) -> tuple[Any, ...]:
    """One column of a batch, converted; C-level mapping on the common paths."""
    # JSON is always memoised: serialising costs far more than the memo.
    shared = _by_identity(values, conv, always=conv is _json_text)
    if shared is not None:
        return shared
    if conv is _sqlite_time and None not in values:
        # Naive timestamps (UTC) format in C; any aware ones are redone one by one.
        out = tuple(map(_ISO, values))
        if set(map(len, out)) == {_NAIVE_LEN}:
            return out
        return tuple(map(_sqlite_time, values))
    if None in values:
        return tuple(None if v is None else conv(v) for v in values)
    return tuple(map(conv, values))


def _batches(
    rows: Iterable[Sequence[Any]], table: str, columns: Sequence[str], dialect: str
) -> Iterator[list[Sequence[Any]]]:
    """Batches of rows with each column converted as its SQL type needs (NULLs stay);
    conversion works column by column, which keeps the per-row Python cost low."""
    meta = Base.metadata.tables[table]
    convs = [
        (i, conv)
        for i, name in enumerate(columns)
        if (conv := _converter(meta.c[name], dialect)) is not None
    ]
    it = iter(rows)
    while batch := list(itertools.islice(it, BATCH_ROWS)):
        if convs:
            cols = list(zip(*batch, strict=True))
            for i, conv in convs:
                cols[i] = _convert_column(cols[i], conv)
            batch = list(zip(*cols, strict=True))
        yield batch


def bulk_load(
    engine: Engine,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    defer_checks: bool = False,
) -> int:
    """Insert every row into `table` in one transaction; return how many were loaded.

    With `defer_checks`, the table's secondary (non-unique) indexes are dropped and
    its foreign keys are not checked row by row; within the same transaction the
    indexes are rebuilt once and the foreign keys checked once over the whole table
    (a violation rolls everything back). Duplicates are always refused: keys stay in
    place, except on PostgreSQL those no foreign key refers to, which are rebuilt
    with the indexes (a duplicate then rolls everything back). Building an index from
    all rows at once is far cheaper than maintaining it per row. Use it on a catalog
    no one else is writing (an import, a benchmark): on PostgreSQL it holds an
    exclusive lock on the table.
    """
    with _no_cyclic_gc():
        if engine.dialect.name == "postgresql":
            return _load_postgres(engine, table, columns, rows, defer_checks)
        return _load_sqlite(engine, table, columns, rows, defer_checks)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cycle collector for the load. Every batch allocates hundreds of
    thousands of tuples, which would trigger a collection every few hundred rows, each
    scanning the whole batch; rows hold no reference cycles, so nothing is lost by
    collecting once afterwards. (Process-wide: this is an import tool, not a server.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _deferred(table: str, defer: bool) -> tuple[list[Index], list[ForeignKeyConstraint]]:
    if not defer:
        return [], []
    meta = Base.metadata.tables[table]
    indexes = sorted((ix for ix in meta.indexes if not ix.unique), key=lambda ix: str(ix.name))
    fks = sorted(meta.foreign_key_constraints, key=lambda fk: str(fk.name))
    return indexes, fks


def _deferred_keys(table: str, defer: bool) -> list[PrimaryKeyConstraint | UniqueConstraint]:
    """The primary and unique keys of `table` that no foreign key refers to: PostgreSQL
    can drop these for the load and rebuild them once (a sort instead of a B-tree
    descent per row; with text keys each descent compares under the database's
    collation). A duplicate then fails the rebuild, which rolls back the whole load."""
    if not defer:
        return []
    meta = Base.metadata.tables[table]
    referenced = {
        frozenset(el.column.name for el in fk.elements)
        for other in Base.metadata.tables.values()
        for fk in other.foreign_key_constraints
        if fk.referred_table is meta
    }
    keys: list[PrimaryKeyConstraint | UniqueConstraint] = [
        c
        for c in meta.constraints
        if isinstance(c, PrimaryKeyConstraint | UniqueConstraint)
        and frozenset(col.name for col in c.columns) not in referenced
    ]
    return sorted(keys, key=lambda c: str(c.name))


def _load_postgres(
    engine: Engine,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    defer: bool,
) -> int:
    cols = ", ".join(_ident(c) for c in columns)
    name = _ident(table)
    indexes, fks = _deferred(table, defer)
    keys = _deferred_keys(table, defer)
    dialect = engine.dialect
    count = 0
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        # Room to sort in memory when rebuilding indexes; local to this transaction.
        cur.execute("SET LOCAL maintenance_work_mem = '256MB'")
        cur.execute("SET LOCAL synchronous_commit = off")
        for fk in fks:
            cur.execute(f"ALTER TABLE {name} DROP CONSTRAINT {_ident(str(fk.name))}")
        for ix in indexes:
            cur.execute(f"DROP INDEX {_ident(str(ix.name))}")
        for key in keys:
            cur.execute(f"ALTER TABLE {name} DROP CONSTRAINT {_ident(str(key.name))}")
        # Binary COPY: the server skips text parsing, the client skips formatting.
        with cur.copy(f"COPY {name} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types([_pg_type(Base.metadata.tables[table].c[c], dialect) for c in columns])
            for batch in _batches(rows, table, columns, "postgresql"):
                for row in batch:
                    copy.write_row(row)
                count += len(batch)
        for key in keys:  # refuses duplicates, as the key would have row by row
            cur.execute(str(AddConstraint(key).compile(dialect=dialect)))
        for ix in indexes:
            cur.execute(str(CreateIndex(ix).compile(dialect=dialect)))
        for fk in fks:  # validates every row once
            cur.execute(str(AddConstraint(fk).compile(dialect=dialect)))
        raw.commit()
    except BaseException:
        raw.rollback()
        raise
    finally:
        raw.close()
    return count


def _load_sqlite(
    engine: Engine,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    defer: bool,
) -> int:
    cols = ", ".join(_ident(c) for c in columns)
    name = _ident(table)
    indexes, fks = _deferred(table, defer)
    count = 0
    raw = engine.raw_connection()
    driver = raw.driver_connection
    if driver is None:
        raise RuntimeError("SQLite connection is closed")
    saved = driver.isolation_level
    driver.isolation_level = None  # explicit BEGIN/COMMIT so DDL joins the transaction
    cur = driver.cursor()
    cache: int | None = None
    try:
        if fks:
            cur.execute("PRAGMA foreign_keys=OFF")  # only outside a transaction
        # WAL with synchronous=NORMAL cannot corrupt; it only defers the fsync.
        cur.execute("PRAGMA synchronous=NORMAL")
        # Room to sort in memory when rebuilding indexes (restored below).
        cache = int(cur.execute("PRAGMA cache_size").fetchone()[0])
        cur.execute(f"PRAGMA cache_size={-LOAD_CACHE_KIB}")
        cur.execute("PRAGMA temp_store=MEMORY")
        cur.execute("BEGIN IMMEDIATE")
        try:
            for ix in indexes:
                cur.execute(f"DROP INDEX {_ident(str(ix.name))}")
            marks = ", ".join("?" for _ in columns)
            sql = f"INSERT INTO {name} ({cols}) VALUES ({marks})"  # noqa: S608 - checked names
            for batch in _batches(rows, table, columns, "sqlite"):
                cur.executemany(sql, batch)
                count += len(batch)
            for ix in indexes:
                cur.execute(str(CreateIndex(ix).compile(dialect=engine.dialect)))
            if fks:
                bad = cur.execute(f"PRAGMA foreign_key_check({name})").fetchmany(3)
                if bad:
                    raise ValueError(f"bulk rows of {name} break foreign keys: {bad}")
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
    finally:
        if fks:
            cur.execute("PRAGMA foreign_keys=ON")
        if cache is not None:
            cur.execute(f"PRAGMA cache_size={cache}")
            cur.execute("PRAGMA temp_store=DEFAULT")
        cur.close()
        driver.isolation_level = saved
        raw.close()
    return count


def after_load(engine: Engine, tables: Sequence[str]) -> None:
    """Advance PostgreSQL id sequences past loaded ids and refresh planner statistics."""
    with engine.begin() as conn:
        for table in tables:
            name = _ident(table)
            if engine.dialect.name == "postgresql" and name in SERIAL_TABLES:
                seq = conn.execute(
                    text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": name}
                ).scalar()
                if seq:
                    conn.execute(
                        text(f"SELECT setval(:s, (SELECT COALESCE(MAX(id), 1) FROM {name}))"),  # noqa: S608
                        {"s": seq},
                    )
            conn.execute(text(f"ANALYZE {name}"))
