"""What agents report of their own copies, written in bulk: one transaction per batch.

An agent's recorder ships its journal as batches of three kinds of facts
(`Catalog.record_holdings`): versions it stored (registered, idempotent on
dataset, key, version), its region's replica of a version (`completed`, `failed`
or `removed`), and transfers (idempotent on their id). Per batch the statements
are a handful of multi-row inserts and selects rather than several transactions
per record, which is what lets one agent's records keep up with its writes.

The holder is the authority on its own copy: a holding sets the replica's state
whatever it was (the `NEXT_STATES` moves of `set_replica_state` are the
replicator's), and several holdings of one replica in a batch come down to the
last one, which is exactly what applying them in order would leave. So a batch
shipped twice, or a run of batches replayed from any point in order, leaves the
catalog as shipping it once did. Called by `Catalog.record_holdings` in its
transaction, under the shared residency lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    FromClause,
    Insert,
    String,
    any_,
    bindparam,
    delete,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from controlplane.catalog.errors import CatalogInputError
from controlplane.catalog.hlc_text import check_hlc
from controlplane.catalog.models import (
    CatalogObject,
    Dataset,
    ObjectVersion,
    PolicyRevision,
    Region,
    Replica,
    Transfer,
)
from controlplane.catalog.records import VERSION_OPS, HeldVersion, Holding, TransferRecord
from controlplane.catalog.unnest import UnnestForm, unnest_form
from controlplane.domain.errors import DigestError
from controlplane.domain.version import Digest

if TYPE_CHECKING:
    from controlplane.catalog.api import Catalog

CHUNK = 400  # rows per IN list (SQLite's bound-parameter limit is 32,766; 3 per row)
ERROR_TEXT_MAX = 2000
T = TypeVar("T")


def check_digest(digest: str, *, what: str) -> None:
    """A put's digest names a known algorithm (dataplane.md: `blake3:<64 hex>`)."""
    try:
        Digest.parse(digest)
    except DigestError as exc:
        raise CatalogInputError(f"{what}: {exc}") from exc


def check_version(v: HeldVersion) -> None:
    what = f"version {v.version} of {v.dataset}/{v.key}"
    if v.op not in VERSION_OPS:
        raise CatalogInputError(f"{what}: op {v.op!r} is not one of {', '.join(VERSION_OPS)}")
    check_hlc(v.version, what=what)
    if v.op == "delete" and v.digest:
        raise CatalogInputError(f"{what} is a delete (a tombstone), which has no digest")
    if v.op == "put":
        check_digest(v.digest, what=what)


def record(
    cat: Catalog,
    s: Session,
    versions: Sequence[HeldVersion],
    holdings: Sequence[Holding],
    transfers: Sequence[TransferRecord],
) -> None:
    for v in versions:
        check_version(v)
    for name in sorted({v.dataset for v in versions} | {h.dataset for h in holdings}):
        cat._ensure_dataset(s, name, {})
    registered = _register(cat.dialect, s, versions)
    _hold(cat, s, holdings, registered)
    _transfer(cat, s, transfers)


def _insert(dialect: str, table: Any) -> postgresql.Insert | sqlite.Insert:
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


# Compiled bulk statements, by (dialect, server version, statement name, column keys):
# the SQL, its column order, each column's bind processor, and on PostgreSQL the
# statement's one-statement form (unnest.py), if it has one.
_COMPILED: dict[tuple[object, ...], tuple[str, tuple[str, ...], list[Any], UnnestForm | None]] = {}


def _execute_many(
    conn: Connection,
    name: str,
    build: Callable[[], Insert],
    table: FromClause,
    rows: Sequence[dict[str, Any]],
) -> None:
    """`conn.execute(build(), rows)` for rows of the same keys, without SQLAlchemy's
    per-row parameter building (most of a recorder batch's Python time): the statement
    is compiled once per dialect and `name`, and each row goes to the driver with each
    column's own bind processor applied, as SQLAlchemy would send it. On PostgreSQL
    the rows go as one array per column in ONE statement (unnest.py), not one
    statement per row."""
    if not rows:
        return
    keys = tuple(rows[0])
    dialect = conn.dialect
    # The driver too: psycopg2 and psycopg (3) are both "postgresql" but bind differently.
    cache_key = (
        dialect.name,
        dialect.driver,
        dialect.paramstyle,
        dialect.server_version_info,
        name,
        keys,
    )
    plan = _COMPILED.get(cache_key)
    if plan is None:
        compiled = build().compile(dialect=dialect, column_keys=list(keys))
        binds = tuple(compiled.bind_names.values())
        order = tuple(compiled.positiontup or ()) if compiled.positional else keys
        # Binds other than the row's columns (a default the statement adds, say): the
        # usual way. Judged on the binds themselves, whatever the paramstyle.
        if sorted(order) != sorted(keys) or sorted(binds) != sorted(keys):
            conn.execute(build(), list(rows))
            return
        # The dialect's own form of each type (e.g. psycopg's JSON), as SQLAlchemy binds it.
        procs = [table.c[k].type.dialect_impl(dialect).bind_processor(dialect) for k in order]
        one = None
        if dialect.name == "postgresql" and dialect.paramstyle == "pyformat":
            one = unnest_form(compiled.string, table, order, dialect)
        plan = _COMPILED[cache_key] = (compiled.string, order, procs, one)
    sql, order, procs, one = plan
    columns = [[row[k] for row in rows] for k in order]
    if one is not None and len(rows) > 1:
        for at, proc in enumerate(procs):
            if proc is not None and at not in one.json_columns:  # those: JSON text
                columns[at] = _processed(columns[at], proc)
        conn.exec_driver_sql(one.sql, one.parameters(columns))
        return
    for at, proc in enumerate(procs):
        if proc is not None:
            columns[at] = _processed(columns[at], proc)
    values = list(zip(*columns, strict=True))
    if dialect.positional:
        conn.exec_driver_sql(sql, values)
    else:
        conn.exec_driver_sql(sql, [dict(zip(order, v, strict=True)) for v in values])


def _processed(values: list[Any], proc: Callable[[Any], Any]) -> list[Any]:
    """A column's values through its bind processor. Timestamps once per distinct value:
    a batch holds few (a bundle's records share theirs), and processing each (its
    zone, then text on SQLite) was a tenth of a recorder batch's time."""
    if not values or not isinstance(values[0], datetime):
        return [proc(v) for v in values]
    # Keyed with the offset too: two times of one zone differing only in `fold` (a
    # repeated hour) are equal to Python, yet different instants.
    done: dict[Any, Any] = {}
    out = []
    for v in values:
        key = (v, v.utcoffset()) if isinstance(v, datetime) else (v, None)
        if key not in done:
            done[key] = proc(v)
        out.append(done[key])
    return out


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _register(
    dialect: str, s: Session, versions: Sequence[HeldVersion]
) -> dict[tuple[str, str, str], _Row]:
    """Register the versions; their rows as registered now (by dataset, key, version),
    which `_hold` then need not look up again."""
    wanted: dict[tuple[str, str, str], HeldVersion] = {}
    for v in versions:
        seen = wanted.setdefault((v.dataset, v.key, v.version), v)
        if (seen.op, seen.digest) != (v.op, v.digest):
            raise CatalogInputError(
                f"version {v.version} of {v.dataset}/{v.key} is reported both as a {seen.op} "
                f"with digest {seen.digest or '(none)'} and as a {v.op} with digest "
                f"{v.digest or '(none)'}"
            )
    if not wanted:
        return {}
    conn = s.connection()
    pairs = sorted({(d, k) for d, k, _ in wanted})
    objects, version_table = CatalogObject.__table__, ObjectVersion.__table__
    _execute_many(
        conn,
        "register objects",
        lambda: _insert(dialect, objects).on_conflict_do_nothing(index_elements=["dataset", "key"]),
        objects,
        [{"dataset": d, "key": k} for d, k in pairs],
    )
    oids = _object_ids(s, pairs)
    _execute_many(
        conn,
        "register versions",
        lambda: _insert(dialect, version_table).on_conflict_do_nothing(
            index_elements=["object_id", "version"]
        ),
        version_table,
        [
            {
                "object_id": oids[(v.dataset, v.key)],
                "version": v.version,
                "digest": v.digest,
                "size": v.size,
                "origin_region": v.origin_region,
                "created_at": v.created_at,
                "hlc": v.version,
                "op": v.op,
                "set_id": v.set_id,
            }
            for v in wanted.values()
        ],
    )
    # What is registered now must be what was reported (an older registration of the
    # same version with another digest or op is refused, as register_version does).
    registered = _versions(s, list(wanted), oids)
    for found in registered:
        v = wanted[(found.dataset, found.key, found.version)]
        if (found.op, found.hlc) != (v.op, v.version):
            raise CatalogInputError(
                f"version {v.version} of {v.dataset}/{v.key} is registered as a {found.op} "
                f"at HLC {found.hlc}, not as a {v.op} at {v.version}"
            )
        if found.digest != v.digest:
            raise CatalogInputError(
                f"version {v.version} of {v.dataset}/{v.key} is registered with digest "
                f"{found.digest}, not {v.digest}"
            )
    return {(r.dataset, r.key, r.version): r for r in registered}


def _by_dataset(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    keys: dict[str, list[str]] = {}
    for dataset, key in pairs:
        keys.setdefault(dataset, []).append(key)
    return sorted(keys.items())


def _among(s: Session, column: Any, values: Sequence[Any], type_: Any) -> ColumnElement[bool]:
    """`column IN values`; on PostgreSQL as `= ANY(one array parameter)`, which the driver
    sends as one value (hundreds of placeholders cost more to build than the query)."""
    if s.get_bind().dialect.name == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(type_)))  # type: ignore[no-any-return]
    return column.in_(list(values))  # type: ignore[no-any-return]


def _object_ids(s: Session, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
    oids: dict[tuple[str, str], int] = {}
    # On the session's connection (Core), not through the ORM: these selects read
    # columns only, and the ORM's result machinery cost as much as the query.
    conn = s.connection()
    postgres = conn.dialect.name == "postgresql"
    for dataset, keys in _by_dataset(pairs):
        for chunk in _chunks(keys):
            if postgres:
                # Each key probes the (dataset, key) index: as `key = ANY(...)` the
                # planner, misled by a young table's statistics, scanned the whole
                # dataset per batch instead (12 ms a batch at 10,000 objects, growing).
                found = conn.execute(_OBJECT_IDS_PG, {"d": dataset, "k": list(chunk)})
            else:
                found = conn.execute(
                    select(CatalogObject.id, CatalogObject.key).where(
                        CatalogObject.dataset == dataset, CatalogObject.key.in_(list(chunk))
                    )
                )
            oids.update({(dataset, r.key): int(r.id) for r in found})
    return oids


_OBJECT_IDS_PG = text(
    "SELECT o.id, o.key FROM unnest(CAST(:k AS TEXT[])) AS u(key)"
    " JOIN objects AS o ON o.dataset = :d AND o.key = u.key"
)


def _versions(
    s: Session,
    refs: Sequence[tuple[str, str, str]],
    oids: dict[tuple[str, str], int] | None = None,
) -> list[_Row]:
    """The registered rows of these (dataset, key, version) triples, with their dataset
    and key. Looked up by object id and version (scalar IN lists on the unique index:
    a row-value IN of hundreds of triples, or a join, plans badly on PostgreSQL).
    `oids`: the objects' ids when the caller has just looked them up."""
    wanted = set(refs)
    if oids is None:
        oids = _object_ids(s, sorted({(d, k) for d, k, _ in wanted}))
    names = {oid: pair for pair, oid in oids.items()}
    rows: list[_Row] = []
    conn = s.connection()  # Core, as in `_object_ids`
    for chunk in _chunks(sorted(names)):
        ids = set(chunk)
        columns = select(
            ObjectVersion.id,
            ObjectVersion.object_id,
            ObjectVersion.digest,
            ObjectVersion.op,
            ObjectVersion.hlc,
            ObjectVersion.version,
        )
        if s.get_bind().dialect.name == "sqlite":
            # SQLite probes the unique index once per (id, version) pair of a row-value
            # IN; two scalar IN lists made it probe every id with every version (400 x
            # 400 per chunk: most of a recorder batch's time on a SQLite catalog).
            pairs = sorted((oids[(d, k)], v) for d, k, v in wanted if oids.get((d, k)) in ids)
            found = conn.execute(
                columns.where(tuple_(ObjectVersion.object_id, ObjectVersion.version).in_(pairs))
            ).all()
        else:
            versions = sorted({v for d, k, v in wanted if oids.get((d, k)) in ids})
            found = conn.execute(
                columns.where(
                    _among(s, ObjectVersion.object_id, chunk, BigInteger),
                    _among(s, ObjectVersion.version, versions, String),
                )
            ).all()
        for r in found:
            dataset, key = names[int(r.object_id)]
            if (dataset, key, r.version) in wanted:
                rows.append(_Row(int(r.id), r.digest, r.op, r.hlc, r.version, dataset, key))
    return rows


@dataclass(frozen=True)
class _Row:
    id: int
    digest: str
    op: str
    hlc: str
    version: str
    dataset: str
    key: str


def _hold(
    cat: Catalog,
    s: Session,
    holdings: Sequence[Holding],
    registered: dict[tuple[str, str, str], _Row],
) -> None:
    last: dict[tuple[str, str, str, str], Holding] = {}
    for h in holdings:
        last[(h.dataset, h.key, h.version, h.region)] = h  # in order: the last one stands
    if not last:
        return
    # Versions the batch registered are known; only the others are looked up.
    others = sorted({k[:3] for k in last if k[:3] not in registered})
    known = dict(registered)
    known.update({(r.dataset, r.key, r.version): r for r in _versions(s, others)} if others else {})
    judged: dict[tuple[str, str], tuple[str, bool]] = {}
    upserts: list[dict[str, Any]] = []
    removals: list[dict[str, Any]] = []
    for h in last.values():
        where = f"the replica of {h.dataset}/{h.key}@{h.version} in {h.region}"
        row = known.get((h.dataset, h.key, h.version))
        if row is None:
            if h.state == "removed":
                continue  # never registered, so nothing to forget
            raise CatalogInputError(f"version {h.version} of {h.dataset}/{h.key} is not registered")
        if h.state == "removed":
            removals.append({"vid": int(row.id), "r": h.region})
            continue
        verified: str | None = None
        if h.state == "completed":
            verified = row.digest if row.op == "delete" and h.digest is None else h.digest
            if verified != row.digest:
                raise CatalogInputError(
                    f"{where} holds digest {verified}, but the version's digest is {row.digest}"
                )
        if (h.dataset, h.region) not in judged:
            judged[(h.dataset, h.region)] = cat._judge(s, h.dataset, h.region)
        jurisdiction, allowed = judged[(h.dataset, h.region)]
        upserts.append(
            {
                "version_id": int(row.id),
                "region": h.region,
                "jurisdiction": jurisdiction,
                "allowed": allowed,
                "state": h.state,
                "updated_at": h.at,
                "verified_digest": verified,
                "attempts": 0,
                "attempted_at": h.at,
                "last_error": None if h.error is None else h.error[:ERROR_TEXT_MAX],
            }
        )
    conn = s.connection()
    replicas = Replica.__table__

    def upsert() -> Insert:
        insert = _insert(cat.dialect, replicas)
        return insert.on_conflict_do_update(
            index_elements=["version_id", "region"],
            set_={
                name: insert.excluded[name]
                for name in (
                    "jurisdiction",
                    "allowed",
                    "state",
                    "updated_at",
                    "verified_digest",
                    "attempted_at",
                    "last_error",
                )
            },
        )

    _execute_many(conn, "hold replicas", upsert, replicas, upserts)
    if removals:
        conn.execute(
            delete(Replica).where(
                Replica.version_id == bindparam("vid"), Replica.region == bindparam("r")
            ),
            removals,
        )


def transfer_row(
    rec: TransferRecord, from_j: str, to_j: str, allowed: bool, residency: Sequence[str] | None
) -> dict[str, Any]:
    """The Transfer row of one record, judged: its jurisdictions, whether it crossed a
    border and whether the residency in force allowed its destination."""
    return {
        "id": rec.id,
        "dataset": rec.dataset,
        "object": rec.object,
        "version": rec.version,
        "from_region": rec.from_region,
        "to_region": rec.to_region,
        "from_jurisdiction": from_j,
        "to_jurisdiction": to_j,
        "logical_bytes": rec.logical_bytes,
        "wire_bytes": rec.wire_bytes,
        "policy_revision": rec.policy_revision,
        "outcome": rec.outcome,
        "cross_border": from_j != to_j,
        "allowed": allowed,
        "residency": list(residency or []),
        "at": rec.at,
    }


def judged_then(
    rec: TransferRecord,
    from_now: str,
    to_now: str,
    residency_now: Sequence[str] | None,
    in_force: int | None,
) -> tuple[str, str, bool, Sequence[str] | None]:
    """The jurisdictions, verdict and residency a transfer is judged by: those in force
    when the copy was made, as its record carries them (audit residency lists every
    *past* transfer outside the residency of its time: a copy made before a narrowing,
    its record shipped after it, is no violation), else the catalog's current ones.
    The record's are trusted only when they come from the revision in force at its
    time (`in_force`) or a later one: an agent whose view lagged a narrowing copied
    under rules no longer in force, and that copy must show. Fail closed, as
    `_judge`: an unplaced dataset's copies are outside residency."""
    trusted = rec.residency is not None and (
        rec.residency_revision is None or rec.residency_revision >= (in_force or 0)
    )
    from_j = (rec.from_jurisdiction if trusted else None) or from_now
    to_j = (rec.to_jurisdiction if trusted else None) or to_now
    residency = list(rec.residency) if trusted and rec.residency is not None else residency_now
    return from_j, to_j, residency is not None and to_j in residency, residency


def revisions_in_force(s: Session) -> list[tuple[datetime, int]]:
    """(applied_at, id) of every applied policy revision, oldest first."""
    rows = s.execute(
        select(PolicyRevision.applied_at, PolicyRevision.id).order_by(PolicyRevision.id)
    )
    return [(_aware(at), int(rid)) for at, rid in rows]


def in_force_at(revisions: list[tuple[datetime, int]], at: datetime) -> int | None:
    """The revision in force at `at` (the newest applied by then), None before any."""
    n = bisect.bisect_right([applied for applied, _ in revisions], _aware(at))
    return revisions[n - 1][1] if n else None


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _transfer(cat: Catalog, s: Session, transfers: Sequence[TransferRecord]) -> None:
    """The batch's transfer rows, idempotent on their id, judged as
    `Catalog._insert_transfer` judges one (jurisdictions, cross-border, allowed by the
    residency in force), with each region and dataset looked up once per batch and
    the rows inserted by one multi-row statement per `CHUNK`: per transfer that was a
    handful of statements, the recorder's main cost when a replicator streams small
    objects in (one transfer record per object)."""
    if not transfers:
        return
    datasets = sorted({t.dataset for t in transfers})
    for name in datasets:
        cat._ensure_dataset(s, name, {})  # audits find transfers by dataset
    names = sorted({t.from_region for t in transfers} | {t.to_region for t in transfers})
    regions = {
        r.name: r.jurisdiction
        for r in s.execute(select(Region.name, Region.jurisdiction).where(Region.name.in_(names)))
    }
    residencies = {
        r.name: r.residency
        for r in s.execute(
            select(Dataset.name, Dataset.residency).where(Dataset.name.in_(datasets))
        )
    }
    revisions = (
        revisions_in_force(s) if any(t.residency_revision is not None for t in transfers) else []
    )
    rows: dict[str, dict[str, Any]] = {}
    for rec in transfers:
        # A region the record names by its jurisdiction of the time need not be in the
        # catalog any more (removed from the topology since).
        to_now = regions.get(rec.to_region) or rec.to_jurisdiction
        if to_now is None:
            raise CatalogInputError(
                f"region {rec.to_region!r} is not in the catalog; apply a topology naming it"
            )
        from_now = regions.get(rec.from_region) or rec.from_jurisdiction
        if from_now is None:
            raise CatalogInputError(f"region {rec.from_region!r} is not in the catalog")
        rows.setdefault(
            rec.id,  # the first record of an id stands, as inserting them in order does
            transfer_row(
                rec,
                *judged_then(
                    rec,
                    from_now,
                    to_now,
                    residencies.get(rec.dataset),
                    in_force_at(revisions, rec.at),
                ),
            ),
        )
    conn = s.connection()
    table = Transfer.__table__
    for chunk in _chunks(list(rows.values())):
        _execute_many(
            conn,
            "record transfers",
            lambda: _insert(cat.dialect, table).on_conflict_do_nothing(index_elements=["id"]),
            table,
            chunk,
        )
