"""Typed ORM models of the catalog: the tables of ARCHITECTURE.md and their indexes.

Two columns are denormalised on purpose so that the audit queries are index scans
over millions of rows: `replicas.jurisdiction` / `replicas.allowed` (the region's
jurisdiction and whether it lies inside the dataset's residency, computed when the
replica is written and recomputed when `policy apply` changes a residency) and
`transfers.allowed` / `transfers.cross_border` (judged against the residency in
force when the transfer was recorded). Partial indexes hold only the rare rows an
auditor asks about.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from controlplane.catalog.types import HlcText, UTCDateTime

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Integer primary keys must autoincrement on SQLite too; BIGINT does not alias ROWID there.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Region(Base):
    __tablename__ = "regions"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    jurisdiction: Mapped[str] = mapped_column(String(8))


class Dataset(Base):
    """A dataset and its desired placement as compiled by the last `policy apply`.

    `policy` is NULL for a dataset registered on first write that no applied policy
    selects; such a dataset has no placement and no residency constraint (copies
    it had before losing its policy keep their verdicts).
    """

    __tablename__ = "datasets"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    declared: Mapped[bool] = mapped_column(Boolean, default=False)
    policy: Mapped[str | None] = mapped_column(String(255), index=True)
    dataset_class: Mapped[str | None] = mapped_column(String(16))
    home: Mapped[str | None] = mapped_column(String(63))
    replicas: Mapped[list[str]] = mapped_column(JSON, default=list)
    residency: Mapped[list[str]] = mapped_column(JSON, default=list)
    failover_mode: Mapped[str | None] = mapped_column(String(16))
    failover_order: Mapped[list[str]] = mapped_column(JSON, default=list)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The whole placement (`Placement.as_json()`), NULL when unplaced; the columns above
    # repeat the parts that queries filter on.
    placement: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class CatalogObject(Base):
    __tablename__ = "objects"
    __table_args__ = (UniqueConstraint("dataset", "key"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dataset: Mapped[str] = mapped_column(ForeignKey("datasets.name", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(1024))


class ObjectVersion(Base):
    """One version of an object, a put or a tombstone (`op = 'delete'`).

    `hlc` orders the versions of an object (dataplane.md: "latest" means highest
    HLC); the unique index on (object_id, hlc) also serves "latest per object". For a
    data-plane version, `version` is its HLC text as well."""

    __tablename__ = "object_versions"
    __table_args__ = (
        UniqueConstraint("object_id", "version"),
        UniqueConstraint("object_id", "hlc"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    object_id: Mapped[int] = mapped_column(ForeignKey("objects.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    origin_region: Mapped[str | None] = mapped_column(String(63))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    hlc: Mapped[str] = mapped_column(HlcText)
    op: Mapped[str] = mapped_column(String(8), default="put", server_default="put")
    set_id: Mapped[str | None] = mapped_column(String(255), nullable=True)


class Replica(Base):
    __tablename__ = "replicas"
    __table_args__ = (
        UniqueConstraint("version_id", "region"),
        Index("ix_replicas_region_state", "region", "state"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("object_versions.id", ondelete="CASCADE"))
    region: Mapped[str] = mapped_column(String(63))
    jurisdiction: Mapped[str] = mapped_column(String(8))
    allowed: Mapped[bool] = mapped_column(Boolean)
    state: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The digest the region checked when it completed the copy (NULL until then).
    verified_digest: Mapped[str | None] = mapped_column(String(128), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Transfer(Base):
    __tablename__ = "transfers"
    __table_args__ = (
        Index("ix_transfers_at", "at"),
        Index("ix_transfers_dataset_at", "dataset", "at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(255))
    object: Mapped[str] = mapped_column(String(1024))
    version: Mapped[str | None] = mapped_column(String(128))
    from_region: Mapped[str] = mapped_column(String(63))
    to_region: Mapped[str] = mapped_column(String(63))
    from_jurisdiction: Mapped[str] = mapped_column(String(8))
    to_jurisdiction: Mapped[str] = mapped_column(String(8))
    logical_bytes: Mapped[int] = mapped_column(BigInteger)
    wire_bytes: Mapped[int] = mapped_column(BigInteger)
    policy_revision: Mapped[int | None] = mapped_column(BigInteger)
    outcome: Mapped[str] = mapped_column(String(16))
    cross_border: Mapped[bool] = mapped_column(Boolean)
    allowed: Mapped[bool] = mapped_column(Boolean)
    residency: Mapped[list[str]] = mapped_column(JSON, default=list)
    at: Mapped[datetime] = mapped_column(UTCDateTime())


def _partial(name: str, column: Any, where: Any) -> Index:
    return Index(name, column, sqlite_where=where, postgresql_where=where)


# Partial indexes: only the rare rows auditors look for, so each audit is an index scan.
_partial("ix_replicas_violation", Replica.id, text("NOT allowed"))
_partial("ix_transfers_violation", Transfer.id, text("NOT allowed"))
_partial("ix_transfers_cross_border_at", Transfer.at, text("cross_border"))


class Failover(Base):
    __tablename__ = "failovers"
    __table_args__ = (Index("ix_failovers_started_at", "started_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    dataset: Mapped[str] = mapped_column(String(255))
    from_region: Mapped[str | None] = mapped_column(String(63))
    to_region: Mapped[str] = mapped_column(String(63))
    epoch: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(255), default="")
    detected_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    rpo_versions: Mapped[int] = mapped_column(Integer, default=0)
    details: Mapped[str] = mapped_column(Text, default="")
    # "moved" or "aborted" (a switchover that left ownership where it was)
    outcome: Mapped[str] = mapped_column(String(16), default="moved", server_default="moved")


class PolicyRevision(Base):
    """One applied policy. `parent` is the revision it was planned against; its
    uniqueness makes two concurrent applies on the same head conflict instead of
    interleaving."""

    __tablename__ = "policy_revisions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    parent: Mapped[int] = mapped_column(BigInteger, unique=True)
    digest: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    applied_by: Mapped[str] = mapped_column(String(255))
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime())
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
