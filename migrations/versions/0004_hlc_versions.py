"""Versions ordered by HLC, tombstones, version sets; replica attempts and verified digests.

* `object_versions.hlc` (HLC text, byte-wise collation on PostgreSQL) with a unique
  index on (object_id, hlc) that also serves "latest per object"; `op` (`put` or
  `delete`: a tombstone is a version) and `set_id` (version sets).
* `replicas.verified_digest`, `attempts`, `last_error`, `attempted_at`: what the data
  plane needs to choose a source, retry, and show why a copy is stuck.
* `datasets.placement`: the whole placement as JSON (the columns repeat what queries
  filter on). Rows placed before this migration have none: the catalog reads their
  policy's terms from the head revision's document (`catalog/placements.py`) until
  the next apply rewrites them whole.

Backfill: a version whose name already is HLC text keeps it as its HLC. Any other
version gets an HLC from its `created_at` in milliseconds, made strictly increasing
in the order the versions of each object were registered (row id), because "latest"
meant "most recently registered" before this migration and must not change meaning.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib
import re
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from controlplane.catalog.types import UTCDateTime
from controlplane.domain.errors import HLCError
from controlplane.domain.hlc import HLC, LOGICAL_MAX, REGION_PATTERN

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

REGION_RE = re.compile(REGION_PATTERN)
HLC_TEXT_LENGTH = 96
BATCH = 5000


def _hlc_type() -> sa.types.TypeEngine[str]:
    return sa.String(HLC_TEXT_LENGTH).with_variant(
        sa.String(HLC_TEXT_LENGTH, collation="C"), "postgresql"
    )


def _ms(value: datetime | str | None) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def _backfill(conn: sa.Connection) -> None:
    versions = sa.table(
        "object_versions",
        sa.column("id", sa.BigInteger),
        sa.column("object_id", sa.BigInteger),
        sa.column("version", sa.String),
        sa.column("origin_region", sa.String),
        sa.column("created_at", sa.DateTime),
        sa.column("hlc", sa.String),
    )
    rows = conn.execute(
        sa.select(
            versions.c.id,
            versions.c.object_id,
            versions.c.version,
            versions.c.origin_region,
            versions.c.created_at,
        ).order_by(versions.c.object_id, versions.c.id)
    )
    current: int | None = None  # the object being numbered
    top = (0, 0)  # the highest (wall_ms, logical) given to one of its versions so far
    pending: list[dict[str, object]] = []
    for vid, oid, name, origin, created in rows:
        if oid != current:
            current, top = oid, (0, 0)
        try:
            given = HLC.parse(name)  # the data plane names versions by their HLC
        except HLCError:
            given = None
        if given is not None:
            stamp, text = (given.wall_ms, given.logical), given.text
        else:
            stamp = (_ms(created), 0)
            if stamp <= top:
                stamp = (top[0], top[1] + 1)
                if stamp[1] > LOGICAL_MAX:  # as the clock does: on to the next millisecond
                    stamp = (stamp[0] + 1, 0)
            region = origin if isinstance(origin, str) and REGION_RE.fullmatch(origin) else None
            text = HLC(stamp[0], stamp[1], region or "unknown").text
        top = max(top, stamp)
        pending.append({"vid": vid, "hlc": text})
        if len(pending) >= BATCH:
            _flush(conn, versions, pending)
    _flush(conn, versions, pending)


def _flush(conn: sa.Connection, versions: sa.TableClause, pending: list[dict[str, object]]) -> None:
    if pending:
        conn.execute(
            versions.update()
            .where(versions.c.id == sa.bindparam("vid"))
            .values(hlc=sa.bindparam("hlc")),
            pending,
        )
        pending.clear()


# SQLite rebuilds a table to change it (batch mode), and refuses to rename the new
# table into place while a view names the old one: the audit views are dropped first
# and created again, exactly as 0002 defines them.
VIEWS = importlib.import_module("migrations.versions.0002_audit_views")


def upgrade() -> None:
    VIEWS.downgrade()
    with op.batch_alter_table("object_versions") as batch:
        batch.add_column(sa.Column("hlc", _hlc_type(), nullable=True))
        batch.add_column(sa.Column("op", sa.String(8), nullable=False, server_default="put"))
        batch.add_column(sa.Column("set_id", sa.String(255), nullable=True))
    _backfill(op.get_bind())
    # A delete has no digest: a catalog downgraded past this migration and upgraded
    # again gets its deletes back as deletes, not as puts of no bytes. (The downgrade
    # loses version sets' ids: a set shows whole again only as its members re-ship.)
    op.execute("UPDATE object_versions SET op = 'delete' WHERE digest = ''")
    with op.batch_alter_table("object_versions") as batch:
        batch.alter_column("hlc", existing_type=_hlc_type(), nullable=False)
        batch.create_unique_constraint("uq_object_versions_object_id_hlc", ["object_id", "hlc"])
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("verified_digest", sa.String(128), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("attempted_at", UTCDateTime(), nullable=True))
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
    # A completed replica names the digest it verified: before this migration that
    # was the version's own digest by construction (only verified copies completed).
    op.execute(
        "UPDATE replicas SET verified_digest = "
        "(SELECT v.digest FROM object_versions v WHERE v.id = replicas.version_id) "
        "WHERE state = 'completed'"
    )
    VIEWS.upgrade()


def downgrade() -> None:
    VIEWS.downgrade()
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("placement")
    with op.batch_alter_table("replicas") as batch:
        for column in ("attempted_at", "last_error", "attempts", "verified_digest"):
            batch.drop_column(column)
    with op.batch_alter_table("object_versions") as batch:
        batch.drop_constraint("uq_object_versions_object_id_hlc", type_="unique")
        for column in ("set_id", "op", "hlc"):
            batch.drop_column(column)
    VIEWS.upgrade()
