"""Bundles: many small objects committed together (`put_many`, `apply_many`)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from store_helpers import object_files, refuse_journal_rows_of, remote

from agents.store import DigestMismatchError, ObjectStore, StorageError, files
from agents.store.names import version_path
from agents.store.store import INLINE_MAX_BYTES, SYNCFS_MIN_FILES
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Verdict, Version
from controlplane.errors import InvalidInputError, UnavailableError


def test_put_many_stores_each_in_one_transaction(store: ObjectStore) -> None:
    items = [("ds", f"small/{i:03d}", [os.urandom(4096)]) for i in range(50)]
    store.put("ds", "small/000", [b"before"])
    versions = store.put_many(items, outbox=True)
    assert len({v.hlc for v in versions}) == 50
    for (dataset, key, chunks), version in zip(items, versions, strict=True):
        assert store.read_bytes(dataset, key) == chunks[0]
        assert store.head(dataset, key) == version
    assert len(store.outbox_pending(limit=1000)) == 50
    assert len(object_files(store.root)) == 51  # small/000 keeps its base
    assert os.listdir(store.root / "tmp") == []


def test_a_bad_bundle_stores_nothing(store: ObjectStore) -> None:
    before = object_files(store.root)
    with pytest.raises(InvalidInputError, match="twice in one bundle"):
        store.put_many([("ds", "a", [b"1"]), ("ds", "a", [b"2"])])
    with pytest.raises(InvalidInputError, match=r"'\.\.' segment"):
        store.put_many([("ds", "a", [b"1"]), ("ds", "../b", [b"2"])])
    good, bad = remote(b"good"), remote(b"bad", logical=1)
    with pytest.raises(DigestMismatchError):
        store.apply_many([("ds", "g", good, [b"good"]), ("ds", "b", bad, [b"BAD"])])
    assert store.head("ds", "g") is None
    assert object_files(store.root) == before
    assert os.listdir(store.root / "tmp") == []


def test_a_failed_bundle_commit_leaves_no_file(store: ObjectStore) -> None:
    refuse_journal_rows_of(store.root, "c")
    with pytest.raises(StorageError, match="refused"):
        store.put_many([("ds", k, [k.encode()]) for k in "abcd"])
    assert object_files(store.root) == []
    assert [store.head("ds", k) for k in "abcd"] == [None] * 4


@pytest.mark.parametrize("size", [5, INLINE_MAX_BYTES + 1], ids=["inline", "file"])
def test_a_version_that_becomes_the_newest_during_the_gate_is_stored(
    store: ObjectStore, size: int
) -> None:
    # v3 (a deposed owner's lone write) is newest when the bundle looks first, so v2's
    # bytes are not read; the gate (the owner read) lets a takeover rewind v3 first.
    # Under the locks v2 applies: it is stored, not answered "applied" with nothing.
    v1_data, v2_data, v3_data = b"1" * size, b"2" * size, b"3" * size
    v1 = remote(v1_data, ago_ms=3000)
    v2 = remote(v2_data, ago_ms=2000)
    v3 = remote(v3_data, ago_ms=1000, region="eu-west")
    store.apply("ds", "k", v1, [v1_data])
    store.apply("ds", "k", v3, [v3_data])

    def rewind_meanwhile() -> None:
        assert store.rewind("ds", "k", v3)

    [result] = store.apply_many([("ds", "k", v2, [v2_data])], gate=rewind_meanwhile)
    assert result.verdict is Verdict.APPLY and result.newest == v2
    assert store.head("ds", "k") == v2 and store.read_bytes("ds", "k") == v2_data


def test_a_tombstone_that_becomes_the_newest_between_two_looks_is_stored(
    store: ObjectStore,
) -> None:
    # `apply` looks once (v3 is newest: not wanted), v3 is rewound, and it looks again
    # for its answer: the tombstone is stored, not answered "applied" over v1.
    v1 = remote(b"1", ago_ms=3000)
    v3 = remote(b"3", ago_ms=1000, region="eu-west")
    store.apply("ds", "k", v1, [b"1"])
    store.apply("ds", "k", v3, [b"3"])
    tomb = Version.delete(HLC(system_ms() - 2000, 0, "us-east"))
    looked = store.wanted

    def rewound_after_the_look(*args: object) -> bool:
        found = looked(*args)  # type: ignore[arg-type]
        assert store.rewind("ds", "k", v3)
        return found

    store.wanted = rewound_after_the_look  # type: ignore[method-assign]
    result = store.apply("ds", "k", tomb)
    assert result.verdict is Verdict.APPLY and result.newest == tomb
    assert store.head("ds", "k") == tomb


def test_apply_many_decides_each_by_lww(store: ObjectStore) -> None:
    held = store.put("ds", "held", [b"local, newer"])
    older = remote(b"older", ago_ms=60_000)
    new = remote(b"new")
    tomb = Version.delete(HLC(system_ms() - 500, 0, "us-east"))
    store.put("ds", "doomed", [b"x"])
    doomed_tomb = Version.delete(HLC(system_ms() + 500, 0, "us-east"))
    results = store.apply_many(
        [
            ("ds", "held", older, [b"older"]),
            ("ds", "new", new, [b"new"]),
            ("ds", "never-put", tomb, None),
            ("ds", "doomed", doomed_tomb, None),
        ],
        transfer={"bundle": 4},
    )
    assert [r.verdict for r in results] == [Verdict.OLDER, Verdict.APPLY] + [Verdict.APPLY] * 2
    assert store.head("ds", "held") == held and store.read_bytes("ds", "new") == b"new"
    assert store.head("ds", "doomed") == doomed_tomb
    assert [j.kind for j in store.journal_pending()].count("transfer") == 1
    again = store.apply_many([("ds", "new", new, [b"new"])])
    assert again[0].verdict is Verdict.SAME
    assert Digest.of(b"new") == store.stat("ds", "new").version.digest


def test_bundles_prune_old_bases_and_complete_sets(store: ObjectStore) -> None:
    # A bundle's rows are written and checked in batches: objects past keep_versions
    # (2) lose their oldest base, and a bundle bringing a set's last member completes
    # the set, exactly as one apply at a time would.
    for n in range(3):
        store.put_many([("ds", k, [f"{k}{n}".encode()]) for k in ("a", "b")])
    assert [len(store.versions("ds", k)) for k in ("a", "b")] == [2, 2]
    assert len(object_files(store.root)) == 4
    first = remote(b"first", ago_ms=0)
    second = remote(b"second", ago_ms=0, logical=1)
    assert store.apply_set("sets", "s1", first.hlc, {"x": first.hlc, "y": second.hlc})
    store.apply_many([("sets", "x", first, [b"first"])])
    with pytest.raises(UnavailableError):
        store.get_set("sets", "s1")
    store.apply_many([("sets", "y", second, [b"second"]), ("ds", "c", remote(b"c"), [b"c"])])
    assert store.get_set("sets", "latest").set_id == "s1"


def test_a_group_prunes_each_object_past_keep_versions_and_journals_each_removal(
    store: ObjectStore,
) -> None:
    # The bases of a whole group are found and removed in a few statements (no sets in
    # the dataset): each object keeps its newest 2, and only the bases past them go,
    # each journalled once, whatever the other objects of the group hold.
    olds = {
        k: [store.put("ds", k, [f"{k}{n}".encode()]) for n in range(n_old)]
        for k, n_old in (("a", 2), ("b", 2), ("c", 1), ("d", 0))
    }
    cursor = max(e.seq for e in store.journal_pending(limit=100))
    store.journal_shipped(cursor)
    new = dict(
        zip("abcd", store.put_many([("ds", k, [k.encode() * 3]) for k in "abcd"]), strict=True)
    )
    for k in "abcd":
        held = [s.version for s in store.versions("ds", k)]
        assert held == [new[k], *olds[k][::-1]][:2], k
    removed = [(e.key, e.hlc) for e in store.journal_pending(limit=100) if e.kind == "removed"]
    assert sorted(removed) == [("a", olds["a"][0].hlc.text), ("b", olds["b"][0].hlc.text)]
    assert len(object_files(store.root)) == 7  # a, b, c: two each; d: one
    assert store.usage().versions == 7


def test_open_many_and_heads_answer_each_object_as_one_at_a_time_would(
    store: ObjectStore,
) -> None:
    a = store.put("ds", "a", [b"A"])
    b_old = store.put("ds", "b", [b"old b"])
    b_new = store.put("ds", "b", [b"new b"])
    store.put("ds", "c", [b"C"])
    tomb = store.delete("ds", "c")
    got = store.open_many(
        [("ds", "a", a.hlc), ("ds", "b", b_old.hlc), ("ds", "c", tomb.hlc), ("ds", "x", a.hlc)]
    )
    assert [r.read_all() for r in got[:2] if not isinstance(r, Exception)] == [b"A", b"old b"]
    assert [type(r).__name__ for r in got[2:]] == ["NotFoundError", "NotFoundError"]
    for r in got[:2]:
        assert not isinstance(r, Exception)
        r.close()
    heads = store.heads([("ds", "a"), ("ds", "b"), ("ds", "c"), ("ds", "x")])
    assert heads == {("ds", "a"): a, ("ds", "b"): b_new, ("ds", "c"): tomb}


def test_a_large_apply_bundle_is_made_durable_by_one_syncfs(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects of a replicator's batch too large to keep inline: written unsynced,
    renamed, then ONE syncfs for their bytes and renames together (two, before and
    after the renames, cost a batch twice the wait); a missing version among them is
    refilled, bytes first."""
    if not files.can_syncfs():
        pytest.skip("no syncfs(2) here")
    lost = remote(b"lost 0", ago_ms=10_000)
    store.apply("ds", "k000", lost, [b"lost 0"])
    (store.root / version_path("ds", "k000", lost.hlc)).unlink()
    store.close()
    store = ObjectStore(store.root, clock=store.clock)  # repair marks k000 missing
    calls: list[str] = []
    real = files.syncfs

    def counted(path: Path) -> None:
        calls.append(str(path))
        real(path)

    monkeypatch.setattr(files, "syncfs", counted)
    count = SYNCFS_MIN_FILES + 8
    datas = [
        f"lost {n}".encode() if n == 0 else os.urandom(INLINE_MAX_BYTES + 100) for n in range(count)
    ]
    items = [
        ("ds", f"k{n:03d}", lost if n == 0 else remote(data), [data])
        for n, data in enumerate(datas)
    ]
    results = store.apply_many(items)
    try:
        assert [r.verdict for r in results[1:]] == [Verdict.APPLY] * (count - 1)
        assert results[0].restored
        for (dataset, key, _, _), data in zip(items, datas, strict=True):
            assert store.read_bytes(dataset, key) == data
        assert os.listdir(store.root / "tmp") == []
        # one before the refill renames over the missing row's path, one for the rest
        assert len(calls) == 2
        calls.clear()
        big = os.urandom(INLINE_MAX_BYTES + 1)
        store.apply_many([("ds", f"n{n:03d}", remote(big), [big]) for n in range(count)])
        assert len(calls) == 1
    finally:
        store.close()


def test_a_small_bundle_s_fsyncs_run_on_the_store_s_threads_and_one_failure_fails_it(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle under SYNCFS_MIN_FILES fsyncs its files in parallel on the store's own
    fsync threads (not a pool, and a thread per file, started for each bundle); a file
    whose fsync fails fails the whole bundle, with nothing stored and no file left.
    (Objects over INLINE_MAX_BYTES: smaller ones are kept in the database, no file.)"""
    count = 6

    def big(n: int) -> bytes:
        return bytes([n]) * (INLINE_MAX_BYTES + 1)

    assert count < SYNCFS_MIN_FILES
    synced_on: list[str] = []
    real = files.fsync_file

    def noted(fd: int) -> None:
        synced_on.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(files, "fsync_file", noted)
    pools = []
    for round_ in range(3):
        store.apply_many([("ds", f"r{round_}/{n}", remote(big(n)), [big(n)]) for n in range(count)])
        pools.append(store._pool)
    me = threading.current_thread().name
    assert len(synced_on) == 3 * count
    # the first fsync of each bundle on the caller's thread, the rest on the store's
    assert synced_on.count(me) == 3
    assert all(n == me or n.startswith("store-fsync") for n in synced_on), synced_on
    assert pools[0] is not None and all(p is pools[0] for p in pools)  # one pool, kept

    def failing(fd: int) -> None:
        if os.fstat(fd).st_size == INLINE_MAX_BYTES + 2:  # the bundle's one such object
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(files, "fsync_file", failing)
    before = object_files(store.root)
    items = [("ds", f"f/{n}", remote(big(n)), [big(n)]) for n in range(count - 1)]
    bad = b"b" * (INLINE_MAX_BYTES + 2)
    items.append(("ds", "f/bad", remote(bad), [bad]))
    with pytest.raises(StorageError, match="Input/output error"):
        store.apply_many(items)
    assert [store.head("ds", k) for _, k, _, _ in items] == [None] * count
    assert object_files(store.root) == before
    assert os.listdir(store.root / "tmp") == []
