"""Fixtures of the agent store's unit tests: a store in a fresh folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_helpers import StoreFactory

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """Open (or reopen) the store at tmp_path/root; every store opened is closed after."""
    opened: list[ObjectStore] = []

    def factory(root: Path | None = None, **kwargs: object) -> ObjectStore:
        kwargs.setdefault("clock", HybridClock("eu-west"))
        store = ObjectStore(root or tmp_path / "root", **kwargs)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: StoreFactory) -> ObjectStore:
    return open_store()
