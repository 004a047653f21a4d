"""Crashes at each step of the write protocol (a child process SIGKILLed there), then
startup repair: the old version or the new one, whole, and nothing else on disk."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import StoreFactory, object_files, remote

from agents.store import MissingContentError, ObjectStore, StorageError
from agents.store.names import version_path
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Digest
from controlplane.errors import ConfigError

CHILD = Path(__file__).with_name("crash_child.py")
NEW = b"new version " * 100_000
OLD = b"old version"


def _crash(root: Path, step: str, *extra: str) -> None:
    done = subprocess.run(
        [sys.executable, str(CHILD), str(root), step, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)


def _check_consistent(store: ObjectStore) -> None:
    """Every object file has a present row and every present row its whole file."""
    present = {
        str(version_path(s.dataset, s.key, s.version.hlc))
        for s in store.versions("ds", "k")
        if s.state == "present" and not s.version.is_tombstone
    }
    assert set(object_files(store.root)) == present
    assert os.listdir(store.root / "tmp") == []


@pytest.mark.parametrize(
    ("step", "committed", "temporaries", "orphans"),
    [
        ("stream", False, 1, 0),
        ("before-rename", False, 1, 0),
        ("after-rename", False, 0, 1),
        ("after-dir-fsync", False, 0, 1),
        ("in-commit", False, 0, 1),
        ("after-commit", True, 0, 1),
        ("bundle-after-rename", False, 1, 2),  # two renamed, the third still in tmp/
        # An apply_many of 40 files: renamed unsynced, then one syncfs, then rows.
        ("apply-bundle-after-rename", False, 38, 2),
        ("apply-bundle-after-syncfs", False, 0, 40),
        # An apply_many of 40 inline objects: its blobs roll back with its rows.
        ("apply-inline-in-commit", False, 0, 0),
    ],
)
def test_crash_at_each_step_leaves_old_or_new_whole(
    tmp_path: Path, step: str, committed: bool, temporaries: int, orphans: int
) -> None:
    root = tmp_path / "root"
    with ObjectStore(root, clock=HybridClock("eu-west"), keep_versions=1) as store:
        old = store.put("ds", "k", [OLD])
    _crash(root, step)
    with ObjectStore(root, clock=HybridClock("eu-west"), keep_versions=1) as store:
        report = store.repair_report
        assert (report.temporaries_removed, report.orphans_removed) == (temporaries, orphans)
        assert report.marked_missing == 0
        with store.open("ds", "k") as reader:
            data = reader.read_all()
            assert Digest.of(data) == reader.version.digest
        if committed:
            assert data == NEW
            assert [s.version.size for s in store.versions("ds", "k")] == [len(NEW)]
        else:
            assert data == OLD and reader.version == old
            assert store.outbox_pending() == []
            assert [j.kind for j in store.journal_pending()] == ["version"]
            assert store.head("ds", "k2") is None and store.head("ds", "k3") is None
            assert store.head("ds", "b0") is None and store.head("ds", "b39") is None
            with contextlib.closing(sqlite3.connect(root / "meta.db")) as conn:
                assert conn.execute("SELECT count(*) FROM inline_bytes").fetchone() == (0,)
        _check_consistent(store)
        # and the store still works
        store.put("ds", "k", [b"after"])
        assert store.read_bytes("ds", "k") == b"after"


def test_row_whose_file_is_gone_or_damaged_is_marked_missing(open_store: StoreFactory) -> None:
    store = open_store(keep_versions=2)
    gone = store.put("ds", "gone", [b"bytes that vanish"])
    short = store.put("ds", "short", [b"bytes that shrink"])
    flipped = store.put("ds", "flipped", [b"bytes that rot"])
    kept_base = store.put("ds", "short", [b"newer"])
    root = store.root
    store.close()
    os.unlink(root / version_path("ds", "gone", gone.hlc))
    (root / version_path("ds", "short", short.hlc)).write_bytes(b"bytes")
    (root / version_path("ds", "flipped", flipped.hlc)).write_bytes(b"BYTES THAT ROT")
    (root / "tmp" / "stray.part").write_bytes(b"half")
    (root / "objects" / "junk").write_bytes(b"not ours")

    store = open_store(verify="digest")
    report = store.repair_report
    assert (report.temporaries_removed, report.orphans_removed, report.marked_missing) == (1, 1, 3)
    for key, version in (("gone", gone), ("flipped", flipped)):
        with pytest.raises(MissingContentError, match="re-sync"):
            store.open("ds", key)
        assert store.versions("ds", key)[0].state == "missing"
        assert store.head("ds", key) == version  # it keeps its place in the LWW order
    with pytest.raises(MissingContentError):
        store.open("ds", "short", short.hlc)
    assert store.read_bytes("ds", "short") == b"newer" and kept_base.size == 5
    missing = [j for j in store.journal_pending() if j.kind == "missing"]
    assert sorted(j.key or "" for j in missing) == ["flipped", "gone", "short"]
    assert store.usage().versions == 1
    # an older put arriving now does not win over the lost newest
    assert not store.apply("ds", "gone", remote(b"x", ago_ms=10**7), [b"x"]).verdict.applies


def test_size_check_alone_misses_rot_of_the_same_size(open_store: StoreFactory) -> None:
    store = open_store()
    v = store.put("ds", "k", [b"abc"])
    root = store.root
    store.close()
    (root / version_path("ds", "k", v.hlc)).write_bytes(b"xyz")
    assert open_store().repair_report.marked_missing == 0  # the default: sizes only


def test_missing_version_is_refilled_by_apply_even_across_a_crash(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    data = b"restored bytes"
    lost = remote(data)
    store.apply("ds", "lost", lost, [data])
    root = store.root
    store.close()
    os.unlink(root / version_path("ds", "lost", lost.hlc))
    store = open_store()
    assert store.repair_report.marked_missing == 1
    store.close()  # the child needs the root's lock

    _crash(root, "restore-after-rename", lost.hlc.text)
    store = open_store()
    assert store.repair_report.restored == 1  # the file was whole: its row is present again
    assert store.read_bytes("ds", "lost") == data

    os.unlink(root / version_path("ds", "lost", lost.hlc))
    store.close()
    store = open_store()
    assert store.repair_report.marked_missing == 1
    result = store.apply("ds", "lost", lost, [data])
    assert result.restored and store.read_bytes("ds", "lost") == data
    assert [j.kind for j in store.journal_pending()][-1] == "restored"


def test_repair_checks_every_row_page_by_page(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    made = [store.put("ds", f"k{i}", [f"bytes {i}".encode()]) for i in range(10)]
    root = store.root
    store.close()
    for i in (0, 4, 9):
        os.unlink(root / version_path("ds", f"k{i}", made[i].hlc))
    monkeypatch.setattr("agents.store.repair._PAGE_ROWS", 3)
    store = open_store()
    assert store.repair_report.marked_missing == 3
    states = {k: store.versions("ds", k)[0].state for k in (f"k{i}" for i in range(10))}
    assert [k for k, s in states.items() if s == "missing"] == ["k0", "k4", "k9"]


def test_a_damaged_metadata_database_is_one_storage_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ObjectStore(root, clock=HybridClock("eu-west")) as store:
        store.put("ds", "k", [b"x"])
    for name in ("meta.db-wal", "meta.db-shm"):
        (root / name).unlink(missing_ok=True)
    (root / "meta.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match="could not be opened"):
        ObjectStore(root, clock=HybridClock("eu-west"))
    # Without its database, the objects are not deleted as orphans: the store refuses.
    (root / "meta.db").unlink()
    before = object_files(root)
    with pytest.raises(ConfigError, match=r"holds objects but no meta\.db"):
        ObjectStore(root, clock=HybridClock("eu-west"))
    assert object_files(root) == before and len(before) == 1
    assert not (root / "meta.db").exists()
