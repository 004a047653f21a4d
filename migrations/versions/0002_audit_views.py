"""Views for auditors: residency_violations and cross_border_transfers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Both views read the denormalised `allowed` / `cross_border` columns, so they are
# scans of small partial indexes; their columns match `meridian audit` JSON fields.
RESIDENCY_VIOLATIONS = """
CREATE VIEW residency_violations AS
SELECT 'replica' AS kind, o.dataset AS dataset, o.key AS object, v.version AS version,
       r.region AS region, r.jurisdiction AS jurisdiction, d.residency AS allowed,
       r.state AS state, r.updated_at AS at
FROM replicas r
JOIN object_versions v ON v.id = r.version_id
JOIN objects o ON o.id = v.object_id
JOIN datasets d ON d.name = o.dataset
WHERE NOT r.allowed
UNION ALL
SELECT 'transfer' AS kind, t.dataset AS dataset, t.object AS object, t.version AS version,
       t.to_region AS region, t.to_jurisdiction AS jurisdiction, t.residency AS allowed,
       t.outcome AS state, t.at AS at
FROM transfers t
WHERE NOT t.allowed
"""

CROSS_BORDER_TRANSFERS = """
CREATE VIEW cross_border_transfers AS
SELECT t.id AS id, t.dataset AS dataset, t.object AS object, t.version AS version,
       t.from_region AS from_region, t.to_region AS to_region,
       t.from_jurisdiction AS from_jurisdiction, t.to_jurisdiction AS to_jurisdiction,
       t.logical_bytes AS logical_bytes, t.wire_bytes AS wire_bytes,
       t.at AS at, t.outcome AS outcome, t.policy_revision AS policy_revision
FROM transfers t
WHERE t.cross_border
"""


def upgrade() -> None:
    op.execute(RESIDENCY_VIOLATIONS)
    op.execute(CROSS_BORDER_TRANSFERS)


def downgrade() -> None:
    op.execute("DROP VIEW cross_border_transfers")
    op.execute("DROP VIEW residency_violations")
