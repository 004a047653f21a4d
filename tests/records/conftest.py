"""Fixtures of the records tests: a store, and a real catalog (SQLite and PostgreSQL)
with the example topology and policies applied."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.catalog_fixtures import catalog_url

from agents.metrics import AgentMetrics
from agents.store import ObjectStore
from controlplane.catalog.api import Catalog, open_catalog
from controlplane.domain.hlc import HybridClock
from controlplane.policy.apply import apply_policy
from controlplane.policy.compiler import compile_files
from controlplane.policy.placer import place

__all__ = ["catalog_url"]

EXAMPLE = Path(__file__).parents[1] / "policy" / "data" / "example.yaml"
REGION = "eu-west"
DATASET = "corpus/web"  # standard, residency EU and US

StoreFactory = Callable[..., ObjectStore]


def applied_catalog(url: str) -> Catalog:
    """The catalog at `url` with the example policy applied (its regions and datasets)."""
    catalog = open_catalog(url, placer=place)
    policy, problems = compile_files([EXAMPLE])
    if policy is None:
        raise RuntimeError(f"the example policy does not compile: {problems}")
    apply_policy(catalog, policy, source="test", publisher=None, applied_by="tester")
    return catalog


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
