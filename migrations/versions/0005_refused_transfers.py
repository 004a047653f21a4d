"""A refused transfer is not a residency violation: the audit view leaves it out.

Agents now record the copies they refused (a receiver or a sender found the
destination outside the dataset's residency) as transfers with outcome `refused`
(dataplane.md, *Residency*: it shows in `audit transfers`). No byte of those
reached the destination, so `residency_violations` (and `audit residency`, which
exits 3 on any row) must not list them; every other transfer outside residency
still is one. Views only: no table changes, and downgrade restores 0002's view.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

VIEWS = importlib.import_module("migrations.versions.0002_audit_views")

RESIDENCY_VIOLATIONS = VIEWS.RESIDENCY_VIOLATIONS.replace(
    "FROM transfers t\nWHERE NOT t.allowed\n",
    "FROM transfers t\nWHERE NOT t.allowed AND t.outcome <> 'refused'\n",
)
if RESIDENCY_VIOLATIONS == VIEWS.RESIDENCY_VIOLATIONS:
    raise RuntimeError("migration 0005 could not find the transfers clause of 0002's view")


def upgrade() -> None:
    op.execute("DROP VIEW residency_violations")
    op.execute(RESIDENCY_VIOLATIONS)


def downgrade() -> None:
    op.execute("DROP VIEW residency_violations")
    op.execute(VIEWS.RESIDENCY_VIOLATIONS)
