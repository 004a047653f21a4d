"""Row-level helpers shared by the store and its startup repair (callers hold the lock
and an open transaction)."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Literal, cast

from agents.store.model import JsonValue, State, StoredVersion
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version

VERSION_COLUMNS = "dataset, key, hlc, op, size, digest, state, set_id, stored_ms"
# Every column of `versions`, the path last (callers cut it off for to_stored).
SELECT_VERSIONS = (
    "SELECT dataset, key, hlc, op, size, digest, state, set_id, stored_ms, path FROM versions"
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Rows parsed lately, by their columns. Under writes the same rows are read again and
# again (an object's older versions by each later write of it, for LWW and pruning),
# and parsing them (an HLC, a digest, a checked Version) was a third of a replica's
# apply_many. A StoredVersion is immutable, so a row's parse can be shared; the cache
# is bounded, and cleared whole when full (cheaper than an LRU's upkeep on every hit).
_PARSED: dict[tuple[object, ...], StoredVersion] = {}
PARSED_MOST = 16_384


def to_stored(row: tuple[object, ...]) -> StoredVersion:
    """A `versions` row (VERSION_COLUMNS, in order) as a StoredVersion."""
    got = _PARSED.get(row)
    if got is not None:
        return got
    stored = _parse(row)
    if len(_PARSED) >= PARSED_MOST:
        _PARSED.clear()
    _PARSED[row] = stored
    return stored


def _parse(row: tuple[object, ...]) -> StoredVersion:
    dataset, key, hlc, op, size, digest, state, set_id, stored_ms = row
    version = Version(
        HLC.parse(hlc),
        cast(Literal["put", "delete"], op),
        cast(int, size),
        None if digest is None else Digest.parse(digest),
    )
    return StoredVersion(
        dataset=cast(str, dataset),
        key=cast(str, key),
        version=version,
        state=cast(State, state),
        set_id=cast("str | None", set_id),
        stored_ms=cast(int, stored_ms),
    )


def version_data(version: Version) -> dict[str, JsonValue]:
    return {
        "hlc": version.hlc.text,
        "op": version.op,
        "size": version.size,
        "digest": None if version.digest is None else version.digest.text,
    }


JournalRow = tuple[str, str, str | None, str | None, int, str]
_INSERT_JOURNAL = (
    "INSERT INTO journal (kind, dataset, key, hlc, at_ms, data) VALUES (?, ?, ?, ?, ?, ?)"
)
LOOKUP_KEYS = 500  # keys per batched lookup (SQLite allows 32,766 parameters)


# One encoder for every row: `json.dumps(..., sort_keys=True)` builds a new one per
# call, and a bundle journals two rows per object.
_ENCODE = json.JSONEncoder(sort_keys=True).encode


def journal_row(
    kind: str,
    dataset: str,
    key: str | None,
    hlc: str | None,
    data: dict[str, JsonValue],
    at_ms: int | None = None,
) -> JournalRow:
    """A journal row; `at_ms` (default now) lets a bundle stamp all its rows at once."""
    return (kind, dataset, key, hlc, now_ms() if at_ms is None else at_ms, _ENCODE(data))


def journal(
    conn: sqlite3.Connection,
    kind: str,
    dataset: str,
    key: str | None,
    hlc: str | None,
    data: dict[str, JsonValue],
) -> None:
    conn.execute(_INSERT_JOURNAL, journal_row(kind, dataset, key, hlc, data))


def journal_many(conn: sqlite3.Connection, entries: list[JournalRow]) -> None:
    """Journal rows in order, in one statement (a bundle's)."""
    conn.executemany(_INSERT_JOURNAL, entries)


def set_floor(conn: sqlite3.Connection, dataset: str) -> str | None:
    """The HLC of the newest complete set of `dataset` (None without one): readers may
    see that set and any newer one, so pruning, set retention and tombstone expiry all
    judge against it."""
    found = conn.execute(
        "SELECT max(hlc) FROM sets WHERE dataset = ? AND complete = 1", (dataset,)
    ).fetchone()[0]
    return cast("str | None", found)


def datasets_with_sets(conn: sqlite3.Connection, datasets: set[str]) -> set[str]:
    """Those of `datasets` that have any version set member (only their versions can
    complete a set)."""
    return {
        d
        for d in datasets
        if conn.execute("SELECT 1 FROM set_members WHERE dataset = ? LIMIT 1", (d,)).fetchone()
    }


def crowded(
    conn: sqlite3.Connection, names: list[tuple[str, str]], keep: int
) -> set[tuple[str, str]]:
    """Those of the objects `names` that hold more than `keep` version rows (only they
    have bases to prune)."""
    by_dataset: dict[str, list[str]] = {}
    for dataset, key in names:
        by_dataset.setdefault(dataset, []).append(key)
    found: set[tuple[str, str]] = set()
    for dataset, keys in by_dataset.items():
        for at in range(0, len(keys), LOOKUP_KEYS):
            part = keys[at : at + LOOKUP_KEYS]
            marks = ",".join("?" * len(part))
            found.update(
                (dataset, key)
                for (key,) in conn.execute(
                    # only "?" marks are formatted in: the values are bound
                    f"SELECT key FROM versions WHERE dataset = ? AND key IN ({marks})"  # noqa: S608
                    " GROUP BY key HAVING count(*) > ?",
                    (dataset, *part, keep),
                )
            )
    return found


def past_keep(
    conn: sqlite3.Connection, names: list[tuple[str, str]], keep: int
) -> list[tuple[object, ...]]:
    """The rows (SELECT_VERSIONS columns) of the objects `names` past the newest `keep`
    versions of each, in one query per dataset and LOOKUP_KEYS keys: pruning a group's
    objects one query each was a fifth of a small overwrite's store CPU. Set pins are
    not considered: for datasets without version sets only."""
    by_dataset: dict[str, dict[str, None]] = {}  # each key once, in order
    for dataset, key in names:
        by_dataset.setdefault(dataset, {})[key] = None
    found: list[tuple[object, ...]] = []
    for dataset, unique in by_dataset.items():
        keys = list(unique)
        for at in range(0, len(keys), LOOKUP_KEYS):
            part = keys[at : at + LOOKUP_KEYS]
            marks = ",".join("?" * len(part))
            found += conn.execute(
                # only "?" marks are formatted in: the values are bound
                f"SELECT {VERSION_COLUMNS}, path FROM (SELECT *, row_number() OVER"  # noqa: S608
                " (PARTITION BY key ORDER BY hlc DESC) AS newer FROM versions"
                f" WHERE dataset = ? AND key IN ({marks})) WHERE newer > ? ORDER BY key, hlc",
                (dataset, *part, keep),
            ).fetchall()
    return found


def refresh_set(conn: sqlite3.Connection, dataset: str, set_id: str) -> bool:
    """Recompute whether every member of a set is stored; return whether it is complete."""
    total, present = conn.execute(
        "SELECT count(*), count(v.hlc) FROM set_members AS m LEFT JOIN versions AS v"
        " ON v.dataset = m.dataset AND v.key = m.key AND v.hlc = m.hlc AND v.state = 'present'"
        " WHERE m.dataset = ? AND m.set_id = ?",
        (dataset, set_id),
    ).fetchone()
    complete = total > 0 and total == present
    conn.execute(
        "UPDATE sets SET complete = ? WHERE dataset = ? AND set_id = ?",
        (int(complete), dataset, set_id),
    )
    return bool(complete)


def refresh_sets_of(conn: sqlite3.Connection, dataset: str, key: str, hlc: str) -> list[str]:
    """Recompute the sets that name this member version; return those now complete."""
    ids = [
        row[0]
        for row in conn.execute(
            "SELECT set_id FROM set_members WHERE dataset = ? AND key = ? AND hlc = ?",
            (dataset, key, hlc),
        )
    ]
    return [set_id for set_id in ids if refresh_set(conn, dataset, set_id)]


def sets_naming(
    conn: sqlite3.Connection, dataset: str, key: str, *, complete_only: bool = False
) -> list[tuple[str, str]]:
    """(set id, HLC) of every set of `dataset` with a member `key` (only the complete
    ones with `complete_only`)."""
    found: list[tuple[str, str]] = conn.execute(
        "SELECT DISTINCT s.set_id, s.hlc FROM set_members AS m JOIN sets AS s"
        " ON s.dataset = m.dataset AND s.set_id = m.set_id"
        " WHERE m.dataset = ? AND m.key = ? AND (s.complete = 1 OR NOT ?)",
        (dataset, key, complete_only),
    ).fetchall()
    return found
