"""`ObjectStore.put_small`: a local write whose bytes are all at hand, kept inline in
the metadata database (no file), checked as a staged write is, committed with its
group, its HLC told before the commit is durable."""

from __future__ import annotations

import os
import sqlite3

import pytest
from store_helpers import object_files

from agents.store import DigestMismatchError, ObjectStore, ShortStreamError, TooLargeError
from agents.store.store import INLINE_MAX_BYTES
from controlplane.domain.version import Digest, Version
from controlplane.errors import InvalidInputError


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
