"""Catalog fixtures on SQLite and PostgreSQL, and a real etcd (see
controlplane.catalog.testing_fixtures)."""

from controlplane.catalog.testing_fixtures import catalog_url, empty_catalog_url, etcd_for_policy

__all__ = ["catalog_url", "empty_catalog_url", "etcd_for_policy"]
