"""The store's WAL does not keep the size of its largest burst: once a checkpoint has
emptied it, the next write cuts it back to `WAL_KEPT_BYTES` (journal_size_limit)."""

from __future__ import annotations

import os

import pytest
from store_helpers import StoreFactory

from agents.store import schema

KiB = 1024
MiB = 1024 * KiB


def test_a_burst_of_inline_versions_leaves_no_wal_of_its_size(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "WAL_KEPT_BYTES", 1 * MiB)
    store = open_store()
    wal = store.root / "meta.db-wal"
    # 3 MiB of 64 KiB versions, kept inline: the WAL grows past the limit (under
    # SQLite's own checkpoint, at 1,000 pages).
    largest = 0
    for n in range(48):
        store.put_small("ckpt/wal", f"k{n}", os.urandom(64 * KiB))
        largest = max(largest, wal.stat().st_size)
    assert largest > 2 * MiB
    # A checkpoint that empties the WAL (SQLite's own does once no reader holds it),
    # then one more write: SQLite restarts the WAL from its head and cuts it back.
    with store._lock:  # the store's own connection, under its lock as its commits use it
        store._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    store.put_small("ckpt/wal", "after", b"one more")
    assert wal.stat().st_size <= 1 * MiB
    assert len(store.read_bytes("ckpt/wal", "k47")) == 64 * KiB
