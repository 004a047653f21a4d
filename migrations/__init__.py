"""Alembic migrations of the Meridian catalog (configured in `controlplane.catalog.migrate`)."""
