"""Catalog fixtures on SQLite and PostgreSQL (see harness.catalog_fixtures)."""

from harness.catalog_fixtures import catalog_url, empty_catalog_url

__all__ = ["catalog_url", "empty_catalog_url"]
