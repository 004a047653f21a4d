"""Which agents of a region hold its copy of a version.

The catalog kept one row per region's copy (`replicas`), and any agent's report
that it no longer held a version deleted that row. In a region of several agents,
an eviction that succeeded on one agent and failed on another erased the region's
copy from the catalog while the second agent still held it: `audit residency`
missed it and `policy apply` narrowed without refusing. `replica_holders` records
each agent that holds the copy; the region's row goes only with its last holder.
Rows from before this migration have no holders, and behave as before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replica_holders",
        sa.Column(
            "version_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("region", sa.String(length=63), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["object_versions.id"],
            name=op.f("fk_replica_holders_version_id_object_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("version_id", "region", "holder", name=op.f("pk_replica_holders")),
    )


def downgrade() -> None:
    op.drop_table("replica_holders")
