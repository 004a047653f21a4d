"""The store's metadata database: SQLite in WAL mode, `meta.db` in the root.

`synchronous=FULL`: a commit is durable when it returns, so a write is
acknowledged only after its row (and its journal and outbox rows, same
transaction) would survive a power cut. Text columns compare byte-wise (BINARY),
so HLC text orders versions as the HLC does.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

FORMAT = "1"

DDL = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions (
    dataset TEXT NOT NULL,
    key TEXT NOT NULL,
    hlc TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('put', 'delete')),
    size INTEGER NOT NULL CHECK (size >= 0),
    digest TEXT,
    path TEXT UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('present', 'missing')),
    set_id TEXT,
    stored_ms INTEGER NOT NULL,
    PRIMARY KEY (dataset, key, hlc)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sets (
    dataset TEXT NOT NULL,
    set_id TEXT NOT NULL,
    hlc TEXT NOT NULL,
    complete INTEGER NOT NULL,
    stored_ms INTEGER NOT NULL,
    PRIMARY KEY (dataset, set_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sets_by_hlc ON sets (dataset, complete, hlc);
CREATE TABLE IF NOT EXISTS set_members (
    dataset TEXT NOT NULL,
    set_id TEXT NOT NULL,
    key TEXT NOT NULL,
    hlc TEXT NOT NULL,
    PRIMARY KEY (dataset, set_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS set_members_by_version ON set_members (dataset, key, hlc);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL CHECK (kind IN ('version', 'set')),
    dataset TEXT NOT NULL,
    key TEXT,
    hlc TEXT NOT NULL,
    op TEXT,
    size INTEGER,
    digest TEXT,
    set_id TEXT,
    members TEXT,
    origin_region TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    policy_revision INTEGER,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    dataset TEXT NOT NULL,
    key TEXT,
    hlc TEXT,
    at_ms INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
"""


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the metadata database. The connection is shared by
    the store's threads under the store's own lock, hence check_same_thread=False;
    transactions are explicit (isolation_level=None, BEGIN IMMEDIATE)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        conn.close()
        raise sqlite3.OperationalError(f"could not put {path} in WAL mode (got {mode})")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(DDL)
    conn.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('format', ?)", (FORMAT,))
    return conn
