"""Startup repair: make the files agree with the metadata, which is authoritative.

Run when a store opens, before anything else may touch it (the root's lock is
held). In order:

1. every file in `tmp/` is removed (writes that never reached step 3 of the
   protocol: nothing refers to them);
2. every file under `objects/` that no row names is removed (a crash
   after the rename but before the commit, or after a pruning commit but before
   its files went), and so is anything there that is not a version file; so is
   every inline blob (`inline_bytes`) no inline version row names (its row gone
   some way the cleanup trigger did not see, or its version refilled as a file);
3. every `present` row whose file is gone, or whose size differs (or, with
   `verify="digest"`, whose content does not hash to its digest), is marked
   `missing` and its damaged file removed;
4. a `missing` row whose file is back and whole (a restore that crashed between
   its rename and its commit) is marked `present` again.

Why mark missing rather than delete the row: the row is the store's memory of
the object's history. Deleting the newest row would let an older version win
LWW again (a replayed older put, or a stale base shown as current); a
`missing` row keeps its place in the order, reads of it fail with a retriable
MissingContentError instead of serving something else, a journal record tells
the catalog this replica is gone (so a resync re-drives it), and `apply` of the
same version refills it. Damage found by size alone is cheap to find; hashing
every file is opt-in (`verify="digest"`), as it reads the whole store.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path, PurePosixPath
from typing import Literal

from agents.store import files, rows
from agents.store.model import RepairReport, StoredVersion
from agents.store.names import OBJECTS, is_version_path
from agents.store.staging import TMP
from controlplane.domain.version import ContentHasher, Digest
from controlplane.errors import ConfigError
from controlplane.logs import get_logger

log = get_logger(__name__)

Verify = Literal["size", "digest"]
_READ_BYTES = 1 << 20
_PAGE_ROWS = 10_000


def run(root: Path, conn: sqlite3.Connection, *, verify: Verify = "size") -> RepairReport:
    """Repair the store at `root` (see the module docstring); return what was done."""
    if verify not in ("size", "digest"):
        raise ConfigError(f"verify must be 'size' or 'digest', got {verify!r}")
    temporaries = _clear_tmp(root / TMP)
    orphans = _remove_orphans(root, conn)
    missing, restored = _check_rows(root, conn, verify)
    report = RepairReport(temporaries, orphans, missing, restored)
    if temporaries or orphans or missing or restored:
        log.warning("store repaired", root=str(root), **vars(report))
    return report


def _clear_tmp(tmp: Path) -> int:
    removed = 0
    for entry in os.scandir(tmp):
        if entry.is_dir(follow_symlinks=False):
            _remove_tree(Path(entry.path))
        else:
            files.remove_file(Path(entry.path))
        removed += 1
    if removed:
        files.fsync_dir(tmp)
    return removed


def _remove_tree(path: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            files.remove_file(Path(dirpath, name))
        for name in dirnames:
            files.remove_empty_dir(Path(dirpath, name))
    files.remove_empty_dir(path)


def _remove_orphans(root: Path, conn: sqlite3.Connection) -> int:
    removed = 0
    top = root / OBJECTS
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            path = Path(dirpath, name)
            relative = PurePosixPath(path.relative_to(root).as_posix())
            if is_version_path(relative):
                found = conn.execute(
                    "SELECT 1 FROM versions WHERE path = ?", (str(relative),)
                ).fetchone()
                if found is not None:
                    continue
            files.remove_file(path)
            removed += 1
    # Folders stay: the fan-out folders are reused, and the store knows them.
    blobs = conn.execute(
        "DELETE FROM inline_bytes WHERE NOT EXISTS (SELECT 1 FROM versions v"
        " WHERE v.dataset = inline_bytes.dataset AND v.key = inline_bytes.key"
        " AND v.hlc = inline_bytes.hlc AND v.op = 'put' AND v.path IS NULL)"
    ).rowcount
    return removed + max(blobs, 0)


def _check_rows(root: Path, conn: sqlite3.Connection, verify: Verify) -> tuple[int, int]:
    # In pages of rows (keyset order), each page one transaction, so that a store of
    # millions of versions is checked in bounded memory.
    missing = restored = 0
    last: tuple[object, ...] = ("", "", "")
    while True:
        page = conn.execute(
            rows.SELECT_VERSIONS + " WHERE op = 'put' AND (dataset, key, hlc) > (?, ?, ?)"
            " ORDER BY dataset, key, hlc LIMIT ?",
            (*last, _PAGE_ROWS),
        ).fetchall()
        if not page:
            return missing, restored
        last = page[-1][:3]
        conn.execute("BEGIN IMMEDIATE")
        try:
            for row in page:
                lost, back = _check_row(root, conn, row, verify)
                missing, restored = missing + lost, restored + back
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _check_row(
    root: Path, conn: sqlite3.Connection, row: tuple[object, ...], verify: Verify
) -> tuple[int, int]:
    stored = rows.to_stored(row[:-1])
    hlc = stored.version.hlc.text
    if row[-1] is None:  # an inline version: its bytes are a row, never a file
        if stored.state == "missing":
            return 0, 0  # nothing can bring them back but an apply (`_restore`)
        # By size, the length only (SQLite reads it from the record header; a blob's
        # bytes are read for the digest only, as a file's are).
        found = conn.execute(
            "SELECT length(data), CASE WHEN ? THEN data END FROM inline_bytes"
            " WHERE dataset = ? AND key = ? AND hlc = ?",
            (verify == "digest", stored.dataset, stored.key, hlc),
        ).fetchone()
        if found is not None and _whole_bytes(
            found[0], found[1], stored.version.size, stored.version.digest
        ):
            return 0, 0
        conn.execute(
            "DELETE FROM inline_bytes WHERE dataset = ? AND key = ? AND hlc = ?",
            (stored.dataset, stored.key, hlc),
        )
        return _lost(conn, stored, "inline bytes missing or damaged at startup"), 0
    path = root / str(row[-1])
    if stored.state == "present":
        if _whole(path, stored.version.size, stored.version.digest, verify):
            return 0, 0
        files.remove_file(path)
        return _lost(conn, stored, "file missing or damaged at startup"), 0
    if not path.exists():
        return 0, 0
    # A restore that crashed before its commit: keep the bytes only if they are whole.
    if not _whole(path, stored.version.size, stored.version.digest, "digest"):
        files.remove_file(path)
        return 0, 0
    _set_state(conn, stored.dataset, stored.key, hlc, "present")
    rows.journal(conn, "restored", stored.dataset, stored.key, hlc, {"hlc": hlc})
    rows.refresh_sets_of(conn, stored.dataset, stored.key, hlc)
    return 0, 1


def _lost(conn: sqlite3.Connection, stored: StoredVersion, reason: str) -> int:
    """Mark a present version `missing` (its bytes are gone), journalled with `reason`."""
    hlc = stored.version.hlc.text
    _set_state(conn, stored.dataset, stored.key, hlc, "missing")
    data = rows.version_data(stored.version)
    data["reason"] = reason
    rows.journal(conn, "missing", stored.dataset, stored.key, hlc, data)
    rows.refresh_sets_of(conn, stored.dataset, stored.key, hlc)
    return 1


def _set_state(conn: sqlite3.Connection, dataset: str, key: str, hlc: str, state: str) -> None:
    conn.execute(
        "UPDATE versions SET state = ? WHERE dataset = ? AND key = ? AND hlc = ?",
        (state, dataset, key, hlc),
    )


def _whole_bytes(length: int, data: bytes | None, size: int, digest: Digest | None) -> bool:
    """Inline bytes of `length` are whole: the size, and the digest when `data` (read
    to verify it) is given."""
    if length != size:
        return False
    if data is None:
        return True
    hasher = ContentHasher()
    hasher.update(data)
    return hasher.digest() == digest


def _whole(path: Path, size: int, digest: Digest | None, verify: Verify) -> bool:
    try:
        if path.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    if verify == "size":
        return True
    hasher = ContentHasher()
    with path.open("rb") as handle:
        while chunk := handle.read(_READ_BYTES):
            hasher.update(chunk)
    return hasher.digest() == digest
