"""Fixtures of the records tests: a store, metrics, and a real catalog (SQLite and
PostgreSQL) with the example topology and policies applied."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.catalog_fixtures import catalog_url
from records_helpers import REGION, StoreFactory, applied_catalog

from agents.metrics import AgentMetrics
from agents.store import ObjectStore
from controlplane.catalog.api import Catalog
from controlplane.domain.hlc import HybridClock

__all__ = ["catalog_url"]


@pytest.fixture
def cat(catalog_url: str) -> Iterator[Catalog]:
    catalog = applied_catalog(catalog_url)
    yield catalog
    catalog.close()


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """Open (or reopen) the store at tmp_path/root; every store opened is closed after."""
    opened: list[ObjectStore] = []

    def factory(**kwargs: object) -> ObjectStore:
        kwargs.setdefault("clock", HybridClock(REGION))
        store = ObjectStore(tmp_path / "root", **kwargs)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: StoreFactory) -> ObjectStore:
    return open_store()


@pytest.fixture
def metrics() -> AgentMetrics:
    return AgentMetrics(REGION, "agent-1")
