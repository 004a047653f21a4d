"""Alembic revision scripts of the catalog."""
