"""Catalog fixtures on SQLite and PostgreSQL (see controlplane.catalog.testing_fixtures)."""

from controlplane.catalog.testing_fixtures import catalog_url, empty_catalog_url

__all__ = ["catalog_url", "empty_catalog_url"]
