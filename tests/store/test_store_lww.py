"""`apply` of versions made elsewhere: last writer wins by HLC, whatever the order."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import StoreFactory, object_files, remote

from agents.store import DigestMismatchError, ObjectStore
from agents.store.staging import StagedWrite
from agents.store.store import INLINE_MAX_BYTES
from controlplane.domain.errors import ClockSkewError
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.version import Digest, Verdict, Version, newest
from controlplane.errors import InvalidInputError


def _never_read() -> Iterator[bytes]:
    raise AssertionError("the bytes of a version LWW refuses must not be read")
    yield b""  # pragma: no cover


def test_newer_applies_older_and_equal_are_no_ops(store: ObjectStore) -> None:
    v2 = remote(b"two", ago_ms=500)
    assert store.apply("ds", "k", v2, [b"two"]).verdict is Verdict.APPLY
    v1 = remote(b"one", ago_ms=900)
    result = store.apply("ds", "k", v1, _never_read())
    assert (result.verdict, result.newest) == (Verdict.OLDER, v2)
    assert store.apply("ds", "k", v2, _never_read()).verdict is Verdict.SAME
    clash = Version.put(v2.hlc, 5, Digest.of(b"other"))
    assert store.apply("ds", "k", clash, _never_read()).verdict is Verdict.COLLISION
    assert store.read_bytes("ds", "k") == b"two"
    assert len(store.versions("ds", "k")) == 1


def test_local_writes_after_apply_are_newer(store: ObjectStore) -> None:
    ahead = remote(b"r", ago_ms=-500)  # half a second ahead of this clock: allowed
    store.apply("ds", "k", ahead, [b"r"])
    local = store.put("ds", "k", [b"local"])
    assert local.hlc > ahead.hlc and store.read_bytes("ds", "k") == b"local"


def test_a_write_made_during_a_copy_s_fsync_is_newer_than_the_copy(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`commit_apply` observes the copy's HLC before its fsync: a local write of the
    same key made while that fsync runs (a move of a critical dataset to this region
    landed meanwhile) is newer, and stays the head once the copy commits."""
    ahead = remote(b"copy", ago_ms=-500)
    staged = store.stage("ds", "k", expected_size=4, expected_digest=ahead.digest)
    staged.write(b"copy")
    syncing, release = threading.Event(), threading.Event()
    finish = store._finish

    def slow(write: StagedWrite) -> Digest:
        if write is staged:  # only the copy's fsync is held
            syncing.set()
            assert release.wait(10)
        return finish(write)

    monkeypatch.setattr(store, "_finish", slow)
    copy = threading.Thread(target=store.commit_apply, args=(staged, ahead))
    copy.start()
    try:
        assert syncing.wait(10)
        local = store.put("ds", "k", [b"local"])
    finally:
        release.set()
        copy.join(10)
    assert local.hlc > ahead.hlc
    assert store.read_bytes("ds", "k") == b"local"
    head = store.head("ds", "k")
    assert head is not None and head.hlc == local.hlc


def test_tombstones_take_part_in_ordering(store: ObjectStore) -> None:
    put = remote(b"x", ago_ms=800)
    tomb = Version.delete(HLC(system_ms() - 400, 0, "us-east"))
    assert store.apply("ds", "k", tomb).verdict is Verdict.APPLY
    assert store.apply("ds", "k", put, _never_read()).verdict is Verdict.OLDER
    assert store.head("ds", "k") == tomb  # a late older put does not resurrect it
    with pytest.raises(InvalidInputError, match="needs its bytes"):
        store.apply("ds", "k", remote(b"y"), None)
    with pytest.raises(InvalidInputError, match="takes none"):
        store.apply("ds", "k", tomb, [b""])


def test_clock_skew_is_refused_before_anything_is_stored(store: ObjectStore) -> None:
    far = remote(b"future", ago_ms=-60_000)
    with pytest.raises(ClockSkewError, match="ahead"):
        store.apply("ds", "k", far, _never_read())
    assert store.head("ds", "k") is None
    assert object_files(store.root) == []


def test_bytes_must_match_the_version(store: ObjectStore) -> None:
    version = remote(b"right")
    with pytest.raises(DigestMismatchError):
        store.apply("ds", "k", version, [b"wrong"])
    assert store.head("ds", "k") is None
    assert os.listdir(store.root / "tmp") == []


def test_apply_records_the_transfer_and_emits_no_event(store: ObjectStore) -> None:
    version = remote(b"abc")
    store.apply("ds", "k", version, [b"abc"], transfer={"from": "us-east", "wire_bytes": 3})
    assert store.outbox_pending() == []
    kinds = [(j.kind, j.data.get("wire_bytes")) for j in store.journal_pending()]
    assert kinds == [("version", None), ("transfer", 3)]


_versions = st.lists(
    st.tuples(
        st.integers(0, 50),  # wall ms offset
        st.integers(0, 3),  # logical
        st.sampled_from(["eu-west", "us-east", "ap-south"]),
        st.binary(max_size=20) | st.none(),  # None: a tombstone
    ),
    min_size=1,
    max_size=7,
    unique_by=lambda v: (v[0], v[1], v[2]),
)


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=25, deadline=None
)
@given(_versions, st.randoms(use_true_random=False))
def test_any_arrival_order_converges_on_the_same_newest(
    tmp_path_factory: pytest.TempPathFactory,
    specs: list[tuple[int, int, str, bytes | None]],
    rnd: object,
) -> None:
    base = system_ms() - 10_000
    made = [
        (
            Version.delete(HLC(base + ms, lg, region))
            if data is None
            else Version.put(HLC(base + ms, lg, region), len(data), Digest.of(data)),
            data,
        )
        for ms, lg, region, data in specs
    ]
    orders = [made, made[::-1]]
    for _ in range(2):
        shuffled = list(made)
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        orders.append(shuffled)
    want = newest(v for v, _ in made)
    heads = set()
    for order in orders:
        root: Path = tmp_path_factory.mktemp("lww")
        with ObjectStore(root, clock=HybridClock("eu-west")) as store:
            for version, data in order:
                store.apply("ds", "k", version, None if data is None else [data])
            heads.add(store.head("ds", "k"))
            # Only a version newer than all before it was stored: the others left no trace.
            records = [j.hlc for j in store.journal_pending() if j.kind == "version"]
            maxima, top = [], None
            for version, _ in order:
                if top is None or version.hlc > top:
                    top = version.hlc
                    maxima.append(top.text)
            assert records == maxima
            if want is not None and not want.is_tombstone:
                assert store.stat("ds", "k").version.digest == want.digest
    assert heads == {want}


def test_every_permutation_of_three_versions(tmp_path: Path) -> None:
    base = system_ms() - 5000
    made = [
        Version.put(HLC(base, 1, "eu-west"), 1, Digest.of(b"a")),
        Version.delete(HLC(base, 1, "us-east")),
        Version.put(HLC(base, 0, "zz-last"), 1, Digest.of(b"c")),
    ]
    data = {made[0]: b"a", made[2]: b"c"}
    for i, order in enumerate(itertools.permutations(made)):
        with ObjectStore(tmp_path / str(i), clock=HybridClock("eu-west")) as store:
            for version in order:
                store.apply("ds", "k", version, [data[version]] if version in data else None)
            assert store.head("ds", "k") == made[1]


def test_remote_apply_then_local_put_in_one_factory(open_store: StoreFactory) -> None:
    store = open_store(keep_versions=3)
    store.apply("ds", "k", remote(b"1", ago_ms=300), [b"1"])
    store.put("ds", "k", [b"2"])
    assert [s.version.hlc.region for s in store.versions("ds", "k")] == ["eu-west", "us-east"]


def test_a_store_opened_with_a_clock_behind_its_stamps_writes_above_them(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    # Stamped at 2,000 ms, then the process restarts with its physical clock at 1,000
    # (stepped back, a lower offset): a put must still be the newest, and a put at the
    # very same millisecond must not take a held version's HLC (and its file).
    big = b"x" * (INLINE_MAX_BYTES + 1)
    first = open_store(clock=HybridClock("eu-west", physical_ms=lambda: 2_000))
    held = first.put("ds", "k", [big])
    first.close()
    for physical in (1_000, 2_000):
        store = open_store(clock=HybridClock("eu-west", physical_ms=lambda p=physical: p))
        newer = store.put("ds", "k", [big[:-1] + bytes([physical % 251])])
        assert newer.hlc > held.hlc and store.head("ds", "k") == newer
        assert store.read_bytes("ds", "k", newer.hlc)[-1] == physical % 251
        held = newer
        store.close()
