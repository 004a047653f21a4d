"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlplane.catalog.types import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("declared", sa.Boolean(), nullable=False),
        sa.Column("policy", sa.String(length=255), nullable=True),
        sa.Column("dataset_class", sa.String(length=16), nullable=True),
        sa.Column("home", sa.String(length=63), nullable=True),
        sa.Column("replicas", sa.JSON(), nullable=False),
        sa.Column("residency", sa.JSON(), nullable=False),
        sa.Column("failover_mode", sa.String(length=16), nullable=True),
        sa.Column("failover_order", sa.JSON(), nullable=False),
        sa.Column("registered_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_datasets")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_datasets_policy"), ["policy"], unique=False)

    op.create_table(
        "failovers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("dataset", sa.String(length=255), nullable=False),
        sa.Column("from_region", sa.String(length=63), nullable=True),
        sa.Column("to_region", sa.String(length=63), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("detected_at", UTCDateTime(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("completed_at", UTCDateTime(), nullable=True),
        sa.Column("rpo_versions", sa.Integer(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_failovers")),
    )
    with op.batch_alter_table("failovers", schema=None) as batch_op:
        batch_op.create_index("ix_failovers_started_at", ["started_at"], unique=False)

    op.create_table(
        "policy_revisions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("parent", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("applied_by", sa.String(length=255), nullable=False),
        sa.Column("applied_at", UTCDateTime(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_revisions")),
        sa.UniqueConstraint("parent", name=op.f("uq_policy_revisions_parent")),
    )
    op.create_table(
        "regions",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("jurisdiction", sa.String(length=8), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_regions")),
    )
    op.create_table(
        "transfers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("dataset", sa.String(length=255), nullable=False),
        sa.Column("object", sa.String(length=1024), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=True),
        sa.Column("from_region", sa.String(length=63), nullable=False),
        sa.Column("to_region", sa.String(length=63), nullable=False),
        sa.Column("from_jurisdiction", sa.String(length=8), nullable=False),
        sa.Column("to_jurisdiction", sa.String(length=8), nullable=False),
        sa.Column("logical_bytes", sa.BigInteger(), nullable=False),
        sa.Column("wire_bytes", sa.BigInteger(), nullable=False),
        sa.Column("policy_revision", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("cross_border", sa.Boolean(), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.Column("residency", sa.JSON(), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transfers")),
    )
    with op.batch_alter_table("transfers", schema=None) as batch_op:
        batch_op.create_index("ix_transfers_at", ["at"], unique=False)
        batch_op.create_index(
            "ix_transfers_cross_border_at",
            ["at"],
            unique=False,
            sqlite_where=sa.text("cross_border"),
            postgresql_where=sa.text("cross_border"),
        )
        batch_op.create_index("ix_transfers_dataset_at", ["dataset", "at"], unique=False)
        batch_op.create_index(
            "ix_transfers_violation",
            ["id"],
            unique=False,
            sqlite_where=sa.text("NOT allowed"),
            postgresql_where=sa.text("NOT allowed"),
        )

    op.create_table(
        "objects",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("dataset", sa.String(length=255), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset"],
            ["datasets.name"],
            name=op.f("fk_objects_dataset_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_objects")),
        sa.UniqueConstraint("dataset", "key", name=op.f("uq_objects_dataset_key")),
    )
    op.create_table(
        "object_versions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "object_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=128), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("origin_region", sa.String(length=63), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["object_id"],
            ["objects.id"],
            name=op.f("fk_object_versions_object_id_objects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_object_versions")),
        sa.UniqueConstraint(
            "object_id", "version", name=op.f("uq_object_versions_object_id_version")
        ),
    )
    op.create_table(
        "replicas",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "version_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("region", sa.String(length=63), nullable=False),
        sa.Column("jurisdiction", sa.String(length=8), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["object_versions.id"],
            name=op.f("fk_replicas_version_id_object_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
        sa.UniqueConstraint("version_id", "region", name=op.f("uq_replicas_version_id_region")),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index("ix_replicas_region_state", ["region", "state"], unique=False)
        batch_op.create_index(
            "ix_replicas_violation",
            ["id"],
            unique=False,
            sqlite_where=sa.text("NOT allowed"),
            postgresql_where=sa.text("NOT allowed"),
        )


def downgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_replicas_violation",
            sqlite_where=sa.text("NOT allowed"),
            postgresql_where=sa.text("NOT allowed"),
        )
        batch_op.drop_index("ix_replicas_region_state")

    op.drop_table("replicas")
    op.drop_table("object_versions")
    op.drop_table("objects")
    with op.batch_alter_table("transfers", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_transfers_violation",
            sqlite_where=sa.text("NOT allowed"),
            postgresql_where=sa.text("NOT allowed"),
        )
        batch_op.drop_index("ix_transfers_dataset_at")
        batch_op.drop_index(
            "ix_transfers_cross_border_at",
            sqlite_where=sa.text("cross_border"),
            postgresql_where=sa.text("cross_border"),
        )
        batch_op.drop_index("ix_transfers_at")

    op.drop_table("transfers")
    op.drop_table("regions")
    op.drop_table("policy_revisions")
    with op.batch_alter_table("failovers", schema=None) as batch_op:
        batch_op.drop_index("ix_failovers_started_at")

    op.drop_table("failovers")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_policy"))

    op.drop_table("datasets")
