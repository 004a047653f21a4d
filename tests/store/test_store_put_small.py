"""`ObjectStore.put_small`: a local write whose bytes are all at hand, kept inline in
the metadata database (no file), checked as a staged write is, committed with its
group, its HLC told before the commit is durable."""

from __future__ import annotations

import os
import sqlite3

import pytest
from store_helpers import StoreFactory, object_files

from agents.store import (
    DigestMismatchError,
    HeldPut,
    ObjectStore,
    ShortStreamError,
    SmallPut,
    TooLargeError,
)
from agents.store.store import INLINE_MAX_BYTES, stripe_of
from controlplane.domain.version import Digest, Version
from controlplane.errors import InvalidInputError, UnavailableError


def stamp(store: ObjectStore, put: SmallPut) -> HeldPut | None:
    return store.stamp_small(store.check_small(put))


def blobs(store: ObjectStore) -> int:
    conn = sqlite3.connect(store.root / "meta.db")
    try:
        count: int = conn.execute("SELECT count(*) FROM inline_bytes").fetchone()[0]
        return count
    finally:
        conn.close()


def test_a_small_put_is_kept_inline_with_its_event_and_journal(store: ObjectStore) -> None:
    data = os.urandom(4096)
    told: list[Version] = []
    version = store.put_small(
        "ds", "k", data, expected_digest=Digest.of(data), outbox=True, on_stamped=told.append
    )
    assert told == [version]
    assert version.size == len(data) and version.digest == Digest.of(data)
    assert store.head("ds", "k") == version
    assert store.read_bytes("ds", "k") == data
    with store.open("ds", "k") as reader:
        assert reader.read() == data
    assert object_files(store.root) == []
    assert blobs(store) == 1
    (event,) = store.outbox_pending(limit=10)
    assert (event.key, event.version) == ("k", version)
    kinds = [e.kind for e in store.journal_pending()]
    assert kinds == ["version"]


def test_an_older_inline_version_is_pruned_with_its_row(store: ObjectStore) -> None:
    versions = [store.put_small("ds", "k", b"v%d" % n) for n in range(store.keep_versions + 2)]
    assert [v.version for v in store.versions("ds", "k")] == versions[::-1][: store.keep_versions]
    assert blobs(store) == store.keep_versions
    store.delete("ds", "k")
    assert store.head("ds", "k") is not None and store.head("ds", "k").is_tombstone


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"expected_size": 5}, ShortStreamError, "ended after 4 of its 5 bytes"),
        ({"expected_size": 3}, TooLargeError, "passed its stated size of 3"),
        ({"expected_digest": Digest.of(b"else")}, DigestMismatchError, "not the stated"),
        ({"max_size": 3}, TooLargeError, "passed the cap of 3 bytes"),
    ],
)
def test_a_small_put_that_fails_its_checks_stores_nothing(
    store: ObjectStore, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    told: list[Version] = []
    with pytest.raises(error, match=match):
        store.put_small("ds", "k", b"data", on_stamped=told.append, **kwargs)  # type: ignore[arg-type]
    assert told == []  # refused before it had an HLC
    assert store.head("ds", "k") is None
    assert blobs(store) == 0
    assert store.journal_pending() == []


def test_bytes_past_the_inline_limit_are_refused_as_a_caller_s_bug(store: ObjectStore) -> None:
    with pytest.raises(InvalidInputError, match="stage it"):
        store.put_small("ds", "k", b"x" * (INLINE_MAX_BYTES + 1))
    assert store.head("ds", "k") is None


def test_small_puts_stamped_without_waiting_commit_together(store: ObjectStore) -> None:
    """`stamp_small` checks and stamps a put without blocking, holding its object's lock;
    `commit_held` commits the held puts in one group and lets go of the locks: until
    then a second write of that object is not stamped (None: its caller waits in a
    thread), so an object's versions commit in the order they were stamped."""
    groups = store.group_stats().groups
    a = stamp(store, SmallPut("ds", "a", b"first a", outbox=True))
    c = stamp(store, SmallPut("ds", "c", b"c" * 100, expected_size=100))
    assert a is not None and c is not None and c.version.hlc > a.version.hlc
    assert store.head("ds", "a") is None  # stamped, not yet committed
    assert stamp(store, SmallPut("ds", "a", b"second a")) is None  # a's lock is held
    assert store.commit_held([a, c]) == ([a.version, c.version], [])
    assert store.group_stats().groups == groups + 1  # one group for both
    assert store.read_bytes("ds", "a") == b"first a"
    assert store.read_bytes("ds", "c") == b"c" * 100
    again = stamp(store, SmallPut("ds", "a", b"second a"))  # its lock is free again
    assert again is not None and again.version.hlc > c.version.hlc
    assert store.commit_held([again]) == ([again.version], [])
    assert [v.version for v in store.versions("ds", "a")] == [again.version, a.version]
    assert [e.key for e in store.outbox_pending(limit=10)] == ["a"]  # only it asked
    assert object_files(store.root) == []


@pytest.mark.parametrize(
    ("put", "error"),
    [
        (SmallPut("ds", "b", b"data", expected_digest=Digest.of(b"else")), DigestMismatchError),
        (SmallPut("ds", "../b", b"data"), InvalidInputError),
        (SmallPut("ds", "b", b"data", max_size=3), TooLargeError),
    ],
)
def test_a_small_put_refused_at_its_check_takes_nothing(
    store: ObjectStore, put: SmallPut, error: type[Exception]
) -> None:
    with pytest.raises(error):
        stamp(store, put)
    assert store.head("ds", "b") is None
    ok = stamp(store, SmallPut("ds", "b", b"data"))  # its lock was not kept
    assert ok is not None and store.commit_held([ok]) == ([ok.version], [])


def test_held_puts_of_a_store_closed_meanwhile_are_refused_and_let_go(
    open_store: StoreFactory,
) -> None:
    store = open_store()
    held = [stamp(store, SmallPut("ds", k, k.encode())) for k in ("a", "b")]
    assert all(h is not None for h in held)
    store.close()
    outcomes, completed = store.commit_held([h for h in held if h is not None])
    assert [type(o) for o in outcomes] == [UnavailableError, UnavailableError]
    assert outcomes[0] is not outcomes[1]  # each its own error object
    assert completed == []
    assert not any(store._stripes[stripe_of("ds", k)].locked() for k in ("a", "b"))
    reopened = open_store()
    assert reopened.head("ds", "a") is None and reopened.head("ds", "b") is None


def test_a_set_completed_by_held_puts_is_left_to_prune_sets(store: ObjectStore) -> None:
    """`commit_held` returns the sets its writes completed instead of pruning for them
    (pruning takes the other members' object locks, and a put queued behind it may
    hold one); `prune_sets` does it: the set before no longer pins o's old version."""
    m0, o0 = store.put_small("ds", "m", b"m0"), store.put_small("ds", "o", b"o0")
    store.commit_set("ds", "s0", {"m": m0.hlc, "o": o0.hlc})  # pins o0
    o2 = [store.put_small("ds", "o", b"o%d" % n) for n in (1, 2)][-1]
    assert o0 in [v.version for v in store.versions("ds", "o")]
    m3 = stamp(store, SmallPut("ds", "m", b"m3", set_id="s1"))
    assert m3 is not None
    store.apply_set("ds", "s1", store.clock.now(), {"m": m3.version.hlc, "o": o2.hlc})
    outcomes, completed = store.commit_held([m3])
    assert outcomes == [m3.version] and completed == [("ds", "s1")]
    assert o0 in [v.version for v in store.versions("ds", "o")]  # not pruned yet
    store.prune_sets(completed)
    assert o0 not in [v.version for v in store.versions("ds", "o")]
    assert store.get_set("ds").set_id == "s1"
