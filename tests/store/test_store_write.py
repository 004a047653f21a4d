"""Writes and reads: round trips, size and digest checks, tombstones, bases kept,
journal and outbox rows, listing, usage, the root's lock."""

from __future__ import annotations

import io
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from store_helpers import StoreFactory, object_files, tree
from structlog.testing import capture_logs

from agents.store import (
    CHUNK_BYTES,
    DigestMismatchError,
    ObjectStore,
    ShortStreamError,
    StorageError,
    StoreLockedError,
    TooLargeError,
)
from agents.store.names import version_path
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.version import Digest, Version
from controlplane.errors import ConfigError, InvalidInputError, NotFoundError, UnavailableError

MiB = 1 << 20


def test_round_trip_empty_small_and_multi_chunk(store: ObjectStore) -> None:
    big = os.urandom(3 * MiB + 17)
    cases = {"empty": b"", "small": b"hello", "big": big}
    for key, data in cases.items():
        step = 100_000
        version = store.put("ds", key, (data[i : i + step] for i in range(0, len(data), step)))
        assert version.size == len(data)
        assert version.digest == Digest("blake3", blake3.blake3(data).hexdigest())
    for key, data in cases.items():
        with store.open("ds", key) as reader:
            chunks = list(reader)
            assert reader.version.size == len(data)
        assert all(0 < len(c) <= CHUNK_BYTES for c in chunks)
        assert b"".join(chunks) == data
    assert len([c for c in store.open("ds", "big")]) == 4


def test_put_from_a_file_object(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(2 * MiB + 5)
    (tmp_path / "f.bin").write_bytes(data)
    with (tmp_path / "f.bin").open("rb") as handle:
        version = store.put("ds", "f.bin", handle)
    assert store.read_bytes("ds", "f.bin") == data
    assert store.stat("ds", "f.bin").version == version
    (tmp_path / "notes.txt").write_text("hello")
    with (tmp_path / "notes.txt").open() as text, pytest.raises(InvalidInputError, match="binary"):
        store.put("ds", "t", text)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="not bytes"):
        store.put("ds", "t", b"raw bytes")  # type: ignore[arg-type]


def _nothing_left_behind(store: ObjectStore) -> None:
    assert os.listdir(store.root / "tmp") == []


def test_size_cap_aborts_at_once_and_stores_nothing(store: ObjectStore) -> None:
    old = store.put("ds", "k", [b"old"])
    pulled: list[int] = []

    def endless() -> Iterator[bytes]:
        for i in range(1000):
            pulled.append(i)
            yield b"x" * 1000

    with pytest.raises(TooLargeError, match="stated size of 5000 bytes"):
        store.put("ds", "k", endless(), expected_size=5000)
    assert len(pulled) == 6  # refused on the chunk that passed the size, not at the end
    with pytest.raises(TooLargeError, match="the cap of 10 bytes"):
        store.put("ds", "k", [b"x" * 11], max_size=10)
    with pytest.raises(ShortStreamError, match="ended after 3 of its 4 bytes"):
        store.put("ds", "k", [b"abc"], expected_size=4)
    assert store.head("ds", "k") == old
    assert store.read_bytes("ds", "k") == b"old"
    _nothing_left_behind(store)
    assert store.put("ds", "k", [b"abcd"], expected_size=4, max_size=4).size == 4


def test_digest_mismatch_is_data_loss_and_invisible(store: ObjectStore) -> None:
    old = store.put("ds", "k", [b"old"])
    files_before = object_files(store.root)
    with pytest.raises(DigestMismatchError, match="nothing was stored") as caught:
        store.put("ds", "k", [b"new bytes"], expected_digest=Digest.of(b"other bytes"))
    assert caught.value.grpc_code == "DATA_LOSS"
    assert store.head("ds", "k") == old
    assert object_files(store.root) == files_before
    _nothing_left_behind(store)
    good = store.put("ds", "k", [b"new bytes"], expected_digest=str(Digest.of(b"new bytes")))
    assert store.head("ds", "k") == good


def test_tombstone_is_a_version(store: ObjectStore) -> None:
    put = store.put("ds", "k", [b"v1"])
    gone = store.delete("ds", "k")
    assert gone.is_tombstone and gone.hlc > put.hlc
    with pytest.raises(NotFoundError, match="was deleted"):
        store.open("ds", "k")
    with pytest.raises(NotFoundError):
        store.stat("ds", "k")
    assert store.stat("ds", "k", include_deleted=True).version == gone
    assert store.head("ds", "k") == gone
    assert store.read_bytes("ds", "k", put.hlc) == b"v1"  # the base is still held
    with pytest.raises(NotFoundError, match="nothing to delete"):
        store.delete("ds", "k")
    with pytest.raises(NotFoundError, match="nothing to delete"):
        store.delete("ds", "never")
    again = store.put("ds", "k", [b"v2"])
    assert store.read_bytes("ds", "k") == b"v2" and again.hlc > gone.hlc


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeps_the_newest_n_versions_bytes_and_rows(open_store: StoreFactory, keep: int) -> None:
    store = open_store(keep_versions=keep)
    made = [store.put("ds", "k", [f"v{i}".encode()]) for i in range(5)]
    held = store.versions("ds", "k")
    assert [s.version for s in held] == made[::-1][:keep]
    assert len(object_files(store.root)) == keep
    for old in made[: 5 - keep]:
        with pytest.raises(NotFoundError):
            store.open("ds", "k", old.hlc)
        assert not (store.root / version_path("ds", "k", old.hlc)).exists()
    assert store.read_bytes("ds", "k", made[5 - keep].hlc) == f"v{5 - keep}".encode()


def test_keep_versions_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        ObjectStore(tmp_path / "r", clock=HybridClock("eu-west"), keep_versions=0)


def test_reader_keeps_its_version_while_it_is_pruned(open_store: StoreFactory) -> None:
    store = open_store(keep_versions=1)
    data = os.urandom(3 * MiB)
    store.put("ds", "k", [data])
    with store.open("ds", "k") as reader:
        first = reader.read()
        store.put("ds", "k", [b"newer"])  # prunes the version being read
        rest = b"".join(reader)
    assert first + rest == data
    assert store.read_bytes("ds", "k") == b"newer"


def test_journal_and_outbox_rows_come_with_the_commit(store: ObjectStore) -> None:
    v1 = store.put("ds", "a", [b"1"], outbox=True, epoch=0, policy_revision=7)
    v2 = store.put("ds", "b", [b"2"])  # critical or replicated: no change event
    store.put("ds", "a", [b"3"], outbox=True, transfer={"from": "us-east", "wire_bytes": 12})
    gone = store.delete("ds", "a", outbox=True)
    events = store.outbox_pending()
    assert [(e.key, e.version.op if e.version else None) for e in events] == [
        ("a", "put"),
        ("a", "put"),
        ("a", "delete"),
    ]
    assert events[0].version == v1 and events[0].policy_revision == 7
    assert events[-1].version == gone and events[0].origin_region == "eu-west"
    assert len({e.event_id for e in events}) == 3
    journal = store.journal_pending()
    kinds = [(j.kind, j.key) for j in journal]
    assert kinds == [
        ("version", "a"),
        ("version", "b"),
        ("version", "a"),
        ("transfer", "a"),
        ("version", "a"),
        ("removed", "a"),  # keep_versions=2: the first put goes with the tombstone
    ]
    assert journal[1].data["digest"] == str(v2.digest) and journal[3].data["wire_bytes"] == 12
    store.outbox_published([events[0].event_id])
    assert [e.event_id for e in store.outbox_pending()] == [e.event_id for e in events[1:]]
    store.journal_shipped(journal[2].seq)
    assert store.journal_position() == journal[2].seq
    assert [j.seq for j in store.journal_pending()] == [j.seq for j in journal[3:]]


def test_a_failed_commit_leaves_no_file_and_no_rows(store: ObjectStore) -> None:
    old = store.put("ds", "k", [b"old"])
    conn = sqlite3.connect(store.root / "meta.db")
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON journal BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="refused"):
        store.put("ds", "k", [b"new"], outbox=True)
    assert store.head("ds", "k") == old
    assert len(object_files(store.root)) == 1  # the renamed file went with the rollback
    assert store.outbox_pending() == []
    _nothing_left_behind(store)


def test_listing_is_paged_by_prefix_and_hides_tombstones(store: ObjectStore) -> None:
    keys = [f"shard-{i:03d}" for i in range(25)] + ["other/x", "shard"]
    for key in keys:
        store.put("ds", key, [key.encode()])
    store.put("ds2", "shard-000", [b"elsewhere"])
    store.delete("ds", "shard-004")
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page = store.list_objects("ds", "shard-", cursor=cursor, limit=7)
        assert len(page.items) <= 7
        seen += [item.key for item in page.items]
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == [f"shard-{i:03d}" for i in range(25) if i != 4]
    everything = store.list_objects("ds", limit=1000, include_deleted=True)
    assert [i.key for i in everything.items] == sorted(keys) and everything.cursor is None
    assert store.list_objects("ds", "nope").items == []
    exact = store.list_objects("ds", "shard-02", limit=5)  # shard-020..024: exactly one page
    assert [i.key for i in exact.items] == [f"shard-{i:03d}" for i in range(20, 25)]
    assert exact.cursor is None
    with pytest.raises(InvalidInputError, match="limit"):
        store.list_objects("ds", limit=0)


def test_usage_counts_live_objects_and_kept_bytes(store: ObjectStore) -> None:
    store.put("ds", "a", [b"x" * 10])
    store.put("ds", "a", [b"y" * 20])
    store.put("ds", "b", [b"z" * 5])
    store.put("ds", "c", [b"w"])
    store.delete("ds", "c")
    usage = store.usage()
    assert (usage.objects, usage.versions, usage.bytes) == (2, 4, 36)


def test_one_process_per_root_and_closed_store(open_store: StoreFactory, tmp_path: Path) -> None:
    store = open_store()
    store.put("ds", "k", [b"1"])
    code = (
        "import sys\nfrom agents.store import ObjectStore\n"
        "from controlplane.domain.hlc import HybridClock\n"
        "try:\n    ObjectStore(sys.argv[1], clock=HybridClock('eu-west'))\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code, str(store.root)], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("StoreLockedError") and "another process" in out
    assert StoreLockedError.retriable
    store.close()
    with pytest.raises(UnavailableError, match="closed"):
        store.head("ds", "k")
    reopened = open_store()
    assert reopened.read_bytes("ds", "k") == b"1"


def test_root_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError, match="not usable"):
        ObjectStore(tmp_path / "file", clock=HybridClock("eu-west"))
    assert tree(tmp_path) == ["file"]


def test_bytes_io_and_generators_give_the_same_digest(store: ObjectStore) -> None:
    data = os.urandom(MiB + 3)
    a = store.put("ds", "a", io.BytesIO(data))
    parts: list[bytes | bytearray | memoryview] = [bytearray(data[:5]), memoryview(data)[5:]]
    b = store.put("ds", "b", iter(parts))
    assert a.digest == b.digest == Digest.of(data)


def test_tombstones_expire_after_the_retention_with_their_bases(open_store: StoreFactory) -> None:
    store = open_store(tombstone_retention_s=3600)
    store.put("ds", "gone", [b"old"])
    tomb = store.delete("ds", "gone")
    store.put("ds", "live", [b"x"])
    store.delete("ds", "live")
    live_again = store.put("ds", "live", [b"y"])
    assert store.expire_tombstones() == 0  # not old enough yet
    later = tomb.hlc.wall_ms + 3600 * 1000 + 1
    assert store.expire_tombstones(now_ms=later) == 1
    assert store.versions("ds", "gone") == []
    assert store.head("ds", "live") == live_again
    assert [p for p in object_files(store.root)] == [
        str(version_path("ds", "live", s.version.hlc))
        for s in store.versions("ds", "live")
        if not s.version.is_tombstone
    ]
    assert (store.usage().objects, store.usage().versions) == (1, 1)
    removed = [j for j in store.journal_pending() if j.kind == "removed" and j.key == "gone"]
    assert {j.data["reason"] for j in removed} == {"tombstone expired"}


def test_tombstone_expiry_reads_a_batch_at_a_time_and_misses_none(
    open_store: StoreFactory,
) -> None:
    # Seven objects across two datasets read two at a time: every expired tombstone is
    # found, whichever batch it falls in, and the objects still live stay.
    store = open_store(tombstone_retention_s=60)
    deleted = {("ds", "a"), ("ds", "c"), ("ds", "d"), ("logs", "x"), ("logs", "z")}
    for dataset, key in [("ds", "a"), ("ds", "b"), ("ds", "c"), ("ds", "d")] + [
        ("logs", k) for k in "xyz"
    ]:
        store.put(dataset, key, [key.encode()])
        if (dataset, key) in deleted:
            store.delete(dataset, key)
    later = system_ms() + 61_000
    assert store.expire_tombstones(now_ms=later, batch=2) == len(deleted)
    left = {(d, k) for d in ("ds", "logs") for k in "abcdxyz" if store.versions(d, k)}
    assert left == {("ds", "b"), ("logs", "y")}
    with pytest.raises(InvalidInputError, match="batch must be at least 1"):
        store.expire_tombstones(batch=0)


def test_tombstone_expiry_reads_what_is_due_not_every_object(open_store: StoreFactory) -> None:
    # A hundred live objects and one expired tombstone, read one candidate at a time:
    # the pass finds the tombstone through its index in a few statements (and forgets
    # it in about twenty), where a walk of the objects took one per object. A delete a
    # put superseded, and one exactly the retention old, are not due.
    store = open_store(tombstone_retention_s=60)
    for n in range(100):
        store.put("ds", f"live-{n:03d}", [b"x"])
    base = system_ms() - 600_000

    def at(key: str, *events: tuple[int, bool]) -> None:
        for wall, deleted in events:
            stamp = HLC(base + wall, 0, "us-east")
            if deleted:
                store.apply("ds", key, Version.delete(stamp), None)
            else:
                store.apply("ds", key, Version.put(stamp, 1, Digest.of(b"x")), [b"x"])

    at("gone", (-9, False), (-1, True))
    at("edge", (-9, False), (0, True))
    at("again", (-9, False), (-5, True), (5, False))
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    try:
        assert store.expire_tombstones(now_ms=base + 60_000, batch=1) == 1
    finally:
        store._db.set_trace_callback(None)
    assert store.versions("ds", "gone") == []
    assert len(store.versions("ds", "edge")) == 2  # its put and its tombstone, kept
    assert store.head("ds", "again") is not None
    assert len(statements) < 40, statements


def test_a_store_made_before_the_tombstone_index_gets_it_on_open(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    # An older agent's store has no `versions_deletes`: the next open builds it (and says
    # so), and the expiry finds through it what that agent deleted.
    store = open_store(tombstone_retention_s=60)
    store.put("ds", "gone", [b"x"])
    tomb = store.delete("ds", "gone")
    store.close()
    with sqlite3.connect(tmp_path / "root" / "meta.db") as db:
        db.execute("DROP INDEX versions_deletes")
    with capture_logs() as logs:
        again = open_store(tombstone_retention_s=60)
    assert [e["index"] for e in logs if e["event"] == "store_index_building"] == [
        "versions_deletes"
    ]
    assert again.expire_tombstones(now_ms=tomb.hlc.wall_ms + 61_000) == 1
    with capture_logs() as logs:  # built once: not again at the next open
        again.close()
        open_store(tombstone_retention_s=60).close()
    assert not [e for e in logs if e["event"] == "store_index_building"]


def test_outbox_events_become_domain_change_events(store: ObjectStore) -> None:
    put = store.put("ds", "a", [b"abc"], outbox=True, policy_revision=3, set_id="s1")
    store.put("ds", "b", [b"x"], outbox=True)  # no policy revision: not publishable
    first, second = store.outbox_pending()
    event = first.change_event(inline=b"abc")
    assert (event.event_id, event.version, event.set, event.policy_revision) == (
        first.event_id,
        put,
        "s1",
        3,
    )
    assert event.log_key == "ds/a" and event.origin_region == "eu-west"
    with pytest.raises(InvalidInputError, match="policy_revision is 0"):
        second.change_event(origin_agent="127.0.0.1:7000")


def test_stat_of_a_version_and_usage_reports_free_space(store: ObjectStore) -> None:
    v1 = store.put("ds", "k", [b"one"])
    store.put("ds", "k", [b"two!"])
    assert store.stat("ds", "k", v1.hlc).version == v1
    assert store.stat("ds", "k", v1.hlc.text).version.size == 3
    with pytest.raises(NotFoundError):
        store.stat("ds", "k", "0000000000001.00000@eu-west")
    assert store.usage().bytes_free > 0


def test_zero_regions_are_stored_as_holes(store: ObjectStore) -> None:
    zeros = bytes(MiB)
    head, tail = b"header", b"tail"
    chunks = [head, *([zeros] * 32), tail, *([zeros] * 8)]  # ends in a hole
    version = store.put("ds", "sparse.img", iter(chunks))
    data = b"".join(chunks)
    assert version.size == len(data) and version.digest == Digest.of(data)
    path = store.root / version_path("ds", "sparse.img", version.hlc)
    assert path.stat().st_size == len(data)
    assert path.stat().st_blocks * 512 < 4 * MiB  # 40 MiB of zeros took no space
    assert store.read_bytes("ds", "sparse.img") == data
    with store.open("ds", "sparse.img") as reader:
        assert sum(len(c) for c in reader) == len(data)


def test_a_resumable_write_cut_inside_a_run_of_zeros_resumes_whole(store: ObjectStore) -> None:
    """A checkpoint taken while the file ends in a hole (zero chunks are seeked over)
    must make the file as long as the offset it reports, or the resume takes up fewer
    bytes than the sender skips and the result comes out short (found by review)."""
    data = os.urandom(MiB) + bytes(MiB) + os.urandom(MiB)
    path = store.root / "transfers" / "cut.part"
    path.parent.mkdir(exist_ok=True)
    first = store.stage_resumable("ds", "img", path, offset=0, expected_size=len(data))
    first.write(data[:MiB])
    first.write(data[MiB : 2 * MiB])  # a whole chunk of zeros: left as a hole
    offset = first.checkpoint()
    first.detach()
    assert offset == 2 * MiB
    assert path.stat().st_size == offset
    again = store.stage_resumable(
        "ds", "img", path, offset=offset, expected_size=len(data), expected_digest=Digest.of(data)
    )
    again.write(data[offset:])
    version = store.commit_put(again)
    assert store.read_bytes("ds", "img", version.hlc) == data
