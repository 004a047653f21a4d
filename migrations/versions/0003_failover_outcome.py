"""Failover journal: an `outcome` column ("moved" or "aborted").

An aborted switchover used to be recognisable only by its reason ("aborted: ...")
or its details (`"aborted": true`); auditors can now filter on a column. Existing
rows are backfilled from both, exactly as the code that read them did.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "failovers",
        sa.Column("outcome", sa.String(16), nullable=False, server_default="moved"),
    )
    # substr, not LIKE: SQLite's LIKE ignores case, and operators' reasons are free text.
    op.execute(
        "UPDATE failovers SET outcome = 'aborted' "
        "WHERE substr(reason, 1, 9) = 'aborted: ' OR details LIKE '%\"aborted\": true%'"
    )


def downgrade() -> None:
    # SQLite cannot drop a column in place: batch mode rebuilds the table.
    with op.batch_alter_table("failovers") as batch:
        batch.drop_column("outcome")
