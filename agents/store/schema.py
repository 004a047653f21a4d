"""The store's metadata database: SQLite in WAL mode, `meta.db` in the root.

`synchronous=FULL`: a commit is durable when it returns, so a write is
acknowledged only after its row (and its journal and outbox rows, same
transaction) would survive a power cut. Text columns compare byte-wise (BINARY),
so HLC text orders versions as the HLC does.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controlplane.logs import get_logger

log = get_logger(__name__)

FORMAT = "2"
# Format 2 added `inline_bytes` and its trigger (DDL, all IF NOT EXISTS): a format-1
# store becomes a format-2 one by creating them and changing its mark (`connect`).
# No format-1 row needs rewriting: every put row there has its file.
UPGRADES_FROM = "1"

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
-- Members stored with their set id (holds_sets): partial, so other rows cost nothing.
CREATE INDEX IF NOT EXISTS versions_in_sets ON versions (set_id) WHERE set_id IS NOT NULL;
-- Tombstones by age (the expiry pass finds the old ones without walking every object):
-- partial, so puts cost nothing. Added within format 2: an index changes no row, and an
-- agent that predates it keeps it up to date as SQLite does every index.
CREATE INDEX IF NOT EXISTS versions_deletes ON versions (hlc, dataset, key) WHERE op = 'delete';
CREATE TABLE IF NOT EXISTS set_members (
    dataset TEXT NOT NULL,
    set_id TEXT NOT NULL,
    key TEXT NOT NULL,
    hlc TEXT NOT NULL,
    PRIMARY KEY (dataset, set_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS set_members_by_version ON set_members (dataset, key, hlc);
-- Sets forgotten here, superseded and never to be complete again (the store's
-- `_drop_superseded_sets`): their id and HLC alone, so that a late, older definition
-- of the same id is still refused (last set wins per id), as a tombstone refuses an
-- older put. One small row for a set's many (a set's members and its row go).
CREATE TABLE IF NOT EXISTS sets_dropped (
    dataset TEXT NOT NULL,
    set_id TEXT NOT NULL,
    hlc TEXT NOT NULL,
    PRIMARY KEY (dataset, set_id)
) WITHOUT ROWID;
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
-- The bytes of small put versions kept here instead of in a file of their own (a row of
-- `versions` with op 'put' and no path): for a 1 KiB object the file's create, rename
-- and sync cost the agent more CPU than everything else of its apply. Written in the
-- transaction of its version row, so that COMMIT is the whole write; deleted with it by
-- the trigger, so no path that removes version rows (prune, delete, hand-off, rewind,
-- tombstone expiry) can leave them behind. A rowid table: the blobs stay out of the
-- b-tree of `versions`, which every lookup walks.
CREATE TABLE IF NOT EXISTS inline_bytes (
    dataset TEXT NOT NULL,
    key TEXT NOT NULL,
    hlc TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (dataset, key, hlc)
);
CREATE TRIGGER IF NOT EXISTS inline_bytes_gone AFTER DELETE ON versions
WHEN OLD.op = 'put' AND OLD.path IS NULL BEGIN
    DELETE FROM inline_bytes WHERE dataset = OLD.dataset AND key = OLD.key AND hlc = OLD.hlc;
END;
CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
-- Usage counters, kept by triggers in the transaction of every change to `versions`, so
-- that usage() reads one row instead of scanning: `objects` counts objects whose newest
-- version is a put; `versions` and `bytes` the put rows whose bytes are present.
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    objects INTEGER NOT NULL,
    versions INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS usage_insert AFTER INSERT ON versions BEGIN
    UPDATE usage SET
        versions = versions + (NEW.op = 'put' AND NEW.state = 'present'),
        bytes = bytes + CASE WHEN NEW.op = 'put' AND NEW.state = 'present'
                             THEN NEW.size ELSE 0 END,
        objects = objects + CASE
            WHEN EXISTS (SELECT 1 FROM versions WHERE dataset = NEW.dataset
                         AND key = NEW.key AND hlc > NEW.hlc) THEN 0
            ELSE (NEW.op = 'put') - coalesce((SELECT op = 'put' FROM versions
                  WHERE dataset = NEW.dataset AND key = NEW.key AND hlc < NEW.hlc
                  ORDER BY hlc DESC LIMIT 1), 0)
            END;
END;
CREATE TRIGGER IF NOT EXISTS usage_delete AFTER DELETE ON versions BEGIN
    UPDATE usage SET
        versions = versions - (OLD.op = 'put' AND OLD.state = 'present'),
        bytes = bytes - CASE WHEN OLD.op = 'put' AND OLD.state = 'present'
                             THEN OLD.size ELSE 0 END,
        objects = objects + CASE
            WHEN EXISTS (SELECT 1 FROM versions WHERE dataset = OLD.dataset
                         AND key = OLD.key AND hlc > OLD.hlc) THEN 0
            ELSE coalesce((SELECT op = 'put' FROM versions
                  WHERE dataset = OLD.dataset AND key = OLD.key AND hlc < OLD.hlc
                  ORDER BY hlc DESC LIMIT 1), 0) - (OLD.op = 'put')
            END;
END;
CREATE TRIGGER IF NOT EXISTS usage_state AFTER UPDATE OF state ON versions
WHEN OLD.op = 'put' AND OLD.state != NEW.state BEGIN
    UPDATE usage SET
        versions = versions + CASE WHEN NEW.state = 'present' THEN 1 ELSE -1 END,
        bytes = bytes + CASE WHEN NEW.state = 'present' THEN NEW.size ELSE -NEW.size END;
END;
"""

# What the counters must equal; used to fill them in a database made before they
# existed, and by the tests.
USAGE_BY_SCAN = """
SELECT
    (SELECT count(*) FROM (SELECT max(hlc), op FROM versions GROUP BY dataset, key)
     WHERE op = 'put'),
    (SELECT count(*) FROM versions WHERE op = 'put' AND state = 'present'),
    (SELECT coalesce(sum(size), 0) FROM versions WHERE op = 'put' AND state = 'present')
"""


WAL_KEPT_BYTES = 64 * 1024 * 1024  # the WAL's size kept after a checkpoint (above)


def _lacks_index(conn: sqlite3.Connection, table: str, index: str) -> bool:
    """Whether `table` exists without `index` (a store made before the index was)."""
    names = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE name IN (?, ?)", (table, index)
        )
    }
    return table in names and index not in names


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
    # Small versions live inline (up to 64 KiB each), so a burst of them grows the WAL
    # by hundreds of MiB before a checkpoint catches up, and SQLite keeps a WAL file at
    # its largest size for ever unless told: once a checkpoint has emptied it, the next
    # commit (which starts it again from its head) cuts it back to this.
    conn.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
    # A group's savepoints spilled their statement journal to a temporary file, made and
    # removed under /var/tmp about once per group commit: an inode allocated and freed
    # each time, which on a no-journal ext4 (this machine's and CI's) costs 0.1-1 ms of
    # CPU per file once many inodes were freed nearby in the last minute (the kernel
    # skips them one by one: `recently_deleted` in fs/ext4/ialloc.c). Memory holds it.
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA foreign_keys=ON")
    if _lacks_index(conn, "versions", "versions_deletes"):
        # A store an older agent made: the index is built now, once, by one scan of the
        # versions (seconds for millions of them) before the agent serves.
        log.info("store_index_building", index="versions_deletes", store=str(path))
    conn.executescript(DDL)
    conn.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('format', ?)", (FORMAT,))
    # The upgrade's tables were made by the DDL above (committed before this mark: a
    # crash between the two leaves a format-1 mark on a store that holds no inline row
    # yet, and the next start upgrades it again).
    conn.execute(
        "UPDATE meta SET value = ? WHERE name = 'format' AND value = ?", (FORMAT, UPGRADES_FROM)
    )
    if conn.execute("SELECT 1 FROM usage WHERE id = 1").fetchone() is None:
        conn.execute(
            "INSERT INTO usage (id, objects, versions, bytes) VALUES (1, ?, ?, ?)",
            conn.execute(USAGE_BY_SCAN).fetchone(),
        )
    return conn
