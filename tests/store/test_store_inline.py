"""Inline versions: small applied puts kept in the metadata database (format 2), not in
a file each; read, served, pruned, repaired and upgraded to like file versions."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from store_helpers import StoreFactory, object_files, refuse_journal_rows_of, remote

from agents.store import MissingContentError, ObjectStore, StorageError
from agents.store.schema import FORMAT
from agents.store.store import INLINE_MAX_BYTES
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Verdict, Version
from controlplane.errors import ConfigError


def inline_rows(root: Path) -> list[tuple[str, str, str]]:
    """The (dataset, key, hlc) of every inline blob, read beside the open store (WAL)."""
    conn = sqlite3.connect(root / "meta.db")
    try:
        return conn.execute(
            "SELECT dataset, key, hlc FROM inline_bytes ORDER BY 1, 2, 3"
        ).fetchall()
    finally:
        conn.close()


def test_small_applied_versions_are_inline_and_read_as_files_are(store: ObjectStore) -> None:
    datas = {f"k{n}": os.urandom(1024) for n in range(5)}
    big = os.urandom(INLINE_MAX_BYTES + 1)
    results = store.apply_many(
        [("ds", k, remote(d), [d]) for k, d in datas.items()] + [("ds", "big", remote(big), [big])]
    )
    assert [r.verdict for r in results] == [Verdict.APPLY] * 6
    # Only the object past the inline limit has a file.
    assert len(object_files(store.root)) == 1
    assert [k for _, k, _ in inline_rows(store.root)] == sorted(datas)
    for k, d in datas.items():
        assert store.read_bytes("ds", k) == d
    # Served in chunks, and through a descriptor (the delta engine's way in).
    with store.open("ds", "k0") as reader:
        assert b"".join(reader.chunks(100)) == datas["k0"]
        with open(f"/proc/self/fd/{reader.fileno()}", "rb") as again:
            assert again.read() == datas["k0"]
    got = store.open_many(
        [("ds", "k1", results[1].newest.hlc), ("ds", "big", results[5].newest.hlc)]
    )
    assert [r.read_all() for r in got if not isinstance(r, Exception)] == [datas["k1"], big]
    for r in got:
        assert not isinstance(r, Exception)
        r.close()
    usage = store.usage()
    assert (usage.objects, usage.versions, usage.bytes) == (6, 6, 5 * 1024 + len(big))
    # A replay is the same version: no second blob.
    again = store.apply_many([("ds", "k0", results[0].newest, [datas["k0"]])])
    assert again[0].verdict is Verdict.SAME
    assert len(inline_rows(store.root)) == 5


def test_inline_bytes_go_with_their_version_rows(store: ObjectStore) -> None:
    """Pruned past keep_versions (2), and forgotten by a hand-off: the blobs with them."""
    versions = []
    for n in range(3):
        data = f"v{n}".encode()
        version = remote(data, ago_ms=10_000 - n * 1000)
        store.apply_many([("ds", "a", version, [data])])
        versions.append(version)
    assert [h for _, _, h in inline_rows(store.root)] == [v.hlc.text for v in versions[1:]]
    assert store.read_bytes("ds", "a", versions[1].hlc) == b"v1"
    assert store.hand_off("ds", "a", versions[2].hlc)
    assert inline_rows(store.root) == []


def test_a_failed_commit_leaves_no_inline_bytes(store: ObjectStore) -> None:
    refuse_journal_rows_of(store.root, "c")
    items = [("ds", k, remote(k.encode()), [k.encode()]) for k in "abcd"]
    with pytest.raises(StorageError, match="refused"):
        store.apply_many(items)
    assert inline_rows(store.root) == []
    assert [store.head("ds", k) for k in "abcd"] == [None] * 4


def test_startup_repair_keeps_inline_versions_and_marks_damaged_ones_missing(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    good, bad = remote(b"good bytes"), remote(b"bad bytes")
    store.apply_many([("ds", "good", good, [b"good bytes"]), ("ds", "bad", bad, [b"bad bytes"])])
    store.close()
    store = open_store()
    assert store.repair_report.marked_missing == 0
    assert store.read_bytes("ds", "good") == b"good bytes"
    store.close()
    conn = sqlite3.connect(store.root / "meta.db")
    conn.execute("UPDATE inline_bytes SET data = ? WHERE key = 'bad'", (b"BAD BYTES",))
    conn.commit()
    conn.close()
    store = open_store(verify="size")  # same length: only the digest can tell
    assert store.repair_report.marked_missing == 0
    store.close()
    store = open_store(verify="digest")
    assert store.repair_report.marked_missing == 1
    with pytest.raises(MissingContentError):
        store.read_bytes("ds", "bad")
    assert store.read_bytes("ds", "good") == b"good bytes"
    # The same version applied again refills it (as a file, the restore's way).
    [result] = store.apply_many([("ds", "bad", bad, [b"bad bytes"])])
    assert result.restored
    assert store.read_bytes("ds", "bad") == b"bad bytes"
    assert len(object_files(store.root)) == 1
    store.close()
    assert open_store(verify="digest").repair_report.marked_missing == 0


def test_startup_repair_removes_inline_bytes_no_inline_version_names(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    kept = remote(b"kept")
    store.apply_many([("ds", "kept", kept, [b"kept"])])
    as_file = store.put("ds", "file", [b"a file's bytes"])
    store.close()
    conn = sqlite3.connect(store.root / "meta.db")
    orphans = [
        ("ds", "gone", kept.hlc.text, b"its row is gone"),  # no version row at all
        ("ds", "file", as_file.hlc.text, b"a file's bytes"),  # its version is a file
    ]
    conn.executemany("INSERT INTO inline_bytes VALUES (?, ?, ?, ?)", orphans)
    conn.commit()
    conn.close()
    store = open_store()
    assert store.repair_report.orphans_removed == 2
    assert inline_rows(store.root) == [("ds", "kept", kept.hlc.text)]
    assert store.read_bytes("ds", "kept") == b"kept"
    assert store.read_bytes("ds", "file") == b"a file's bytes"
    store.close()
    assert open_store().repair_report.orphans_removed == 0


def test_a_format_1_store_is_upgraded_in_place(open_store: StoreFactory) -> None:
    store = open_store()
    old = store.put("ds", "file", [b"from format 1"])
    tomb = Version.delete(HLC(system_ms() - 100, 0, "us-east"))
    store.apply_many([("ds", "gone", tomb, None)])
    store.close()
    conn = sqlite3.connect(store.root / "meta.db")
    conn.executescript(
        "DROP TRIGGER inline_bytes_gone; DROP TABLE inline_bytes;"
        " UPDATE meta SET value = '1' WHERE name = 'format';"
    )
    conn.close()
    store = open_store()
    assert store.repair_report.marked_missing == 0
    assert store.read_bytes("ds", "file", old.hlc) == b"from format 1"
    data = b"inline after the upgrade"
    store.apply_many([("ds", "new", remote(data), [data])])
    assert store.read_bytes("ds", "new") == data
    assert [k for _, k, _ in inline_rows(store.root)] == ["new"]
    store.close()
    conn = sqlite3.connect(store.root / "meta.db")
    assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() == (FORMAT,)
    # A format this code does not know stays refused.
    conn.execute("UPDATE meta SET value = '99' WHERE name = 'format'")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match="format 99"):
        open_store()
