"""A stateful property test: random puts, deletes, remote applies, bundles and reopens
against a model of what LWW and keep_versions say the store holds; small puts
(`put_small`) and applied bundles (`apply_many`) are kept inline, in the database,
and their bytes go with their rows."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from store_helpers import object_files

from agents.store import ObjectStore
from agents.store.names import version_path
from agents.store.schema import USAGE_BY_SCAN
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.version import Digest, Version, newest

KEYS = st.sampled_from(["a", "b/c", "é"])
KEEP = 2


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.store = self._open()
        self.seen: dict[str, list[Version]] = {}  # every version that reached each key
        self.data: dict[Version, bytes] = {}
        self.inline: set[Version] = set()  # kept in `inline_bytes`, not in a file
        self.base = system_ms() - 200_000  # remote stamps: in the past, never skewed

    def _open(self) -> ObjectStore:
        return ObjectStore(self.dir / "root", clock=HybridClock("eu-west"), keep_versions=KEEP)

    def _saw(self, key: str, version: Version, data: bytes | None) -> None:
        self.seen.setdefault(key, []).append(version)
        if data is not None:
            self.data[version] = data

    @rule(key=KEYS, data=st.binary(max_size=64))
    def put(self, key: str, data: bytes) -> None:
        self._saw(key, self.store.put("ds", key, [data]), data)

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        held = self.store.head("ds", key)
        if held is not None and not held.is_tombstone:
            self._saw(key, self.store.delete("ds", key), None)

    @rule(key=KEYS, offset=st.integers(0, 150_000), data=st.binary(max_size=64) | st.none())
    def apply(self, key: str, offset: int, data: bytes | None) -> None:
        hlc = HLC(self.base + offset, 0, "us-east")
        if any(v.hlc == hlc for v in self.seen.get(key, [])):
            return
        version = (
            Version.delete(hlc) if data is None else Version.put(hlc, len(data), Digest.of(data))
        )
        result = self.store.apply("ds", key, version, None if data is None else [data])
        if result.verdict.applies:
            self._saw(key, version, data)

    @rule(key=KEYS, data=st.binary(max_size=64))
    def put_small(self, key: str, data: bytes) -> None:
        version = self.store.put_small("ds", key, data)
        self._saw(key, version, data)
        self.inline.add(version)

    @rule(
        items=st.dictionaries(
            KEYS, st.tuples(st.integers(0, 150_000), st.binary(max_size=64) | st.none()), min_size=1
        )
    )
    def apply_many(self, items: dict[str, tuple[int, bytes | None]]) -> None:
        batch = []
        for key, (offset, data) in items.items():
            hlc = HLC(self.base + offset, 1, "us-east")
            if any(v.hlc == hlc for v in self.seen.get(key, [])):
                return
            version = (
                Version.delete(hlc)
                if data is None
                else Version.put(hlc, len(data), Digest.of(data))
            )
            batch.append(("ds", key, version, None if data is None else [data]))
        results = self.store.apply_many(batch)
        for (_, key, version, source), result in zip(batch, results, strict=True):
            if result.verdict.applies:
                self._saw(key, version, None if source is None else source[0])
                if source is not None:
                    self.inline.add(version)

    @rule(data=st.binary(max_size=32))
    def put_bundle(self, data: bytes) -> None:
        made = self.store.put_many([("ds", "a", [data]), ("ds", "bundle", [data + b"!"])])
        self._saw("a", made[0], data)
        self._saw("bundle", made[1], data + b"!")

    @precondition(lambda self: self.seen)
    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()
        report = self.store.repair_report
        assert (report.temporaries_removed, report.orphans_removed, report.marked_missing) == (
            0,
            0,
            0,
        )

    @invariant()
    def holds_what_lww_and_keep_versions_say(self) -> None:
        expected_files: set[str] = set()
        expected_blobs: set[tuple[str, str]] = set()
        for key, versions in self.seen.items():
            held = [s.version for s in self.store.versions("ds", key)]
            want = sorted(versions, key=lambda v: v.hlc, reverse=True)[:KEEP]
            assert held == want
            assert self.store.head("ds", key) == newest(versions)
            top = want[0]
            if not top.is_tombstone:
                assert self.store.read_bytes("ds", key) == self.data[top]
            expected_files |= {
                str(version_path("ds", key, v.hlc))
                for v in want
                if not v.is_tombstone and v not in self.inline
            }
            expected_blobs |= {
                (key, v.hlc.text) for v in want if not v.is_tombstone and v in self.inline
            }
        assert set(object_files(self.store.root)) == expected_files
        blobs = self.store._db.execute("SELECT key, hlc FROM inline_bytes").fetchall()
        assert set(blobs) == expected_blobs and len(blobs) == len(expected_blobs)
        usage = self.store.usage()
        counted = self.store._db.execute(USAGE_BY_SCAN).fetchone()
        assert (usage.objects, usage.versions, usage.bytes) == counted
        live = [k for k, vs in self.seen.items() if not newest(vs).is_tombstone]  # type: ignore[union-attr]
        assert usage.objects == len(live)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=10, stateful_step_count=20, deadline=None)
test_store_against_its_model = StoreMachine.TestCase


def test_metadata_is_wal_with_full_sync(tmp_path: Path) -> None:
    with ObjectStore(tmp_path / "root", clock=HybridClock("eu-west")) as store:
        store.put("ds", "k", [b"x"])
        conn = sqlite3.connect(tmp_path / "root" / "meta.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
