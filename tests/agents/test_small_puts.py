"""Small Puts stamped on the event loop and committed by one thread in groups
(agents/service/small_puts.py): a put's version is known at once, before its commit
is durable; the puts queued while the thread commits go in its next group, each
with its own outcome; a put of an object being written waits for it in a thread,
so an object's versions keep their order; a bad put is refused with nothing kept."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import until

from agents.service.small_puts import SmallPuts
from agents.store import DigestMismatchError, ObjectStore, SmallPut
from agents.store import store as store_module
from agents.store.store import stripe_of
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Digest, Version
from controlplane.errors import UnavailableError

TIMEOUT_S = 10.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ObjectStore]:
    opened = ObjectStore(tmp_path / "root", clock=HybridClock("eu-west"))
    yield opened
    opened.close()


class _HeldCommits:
    """The store's group commits, the first held until `go` is set."""

    def __init__(self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.groups: list[list[str]] = []
        install = store._install_entries

        def held(entries: list[object]) -> object:
            self.groups.append([e.key for e in entries])  # type: ignore[attr-defined]
            if len(self.groups) == 1:
                self.entered.set()
                assert self.go.wait(TIMEOUT_S)
            return install(entries)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "_install_entries", held)


async def _entered(commits: _HeldCommits) -> None:
    """Until the first commit is held (its thread sets the event)."""
    assert await asyncio.to_thread(commits.entered.wait, TIMEOUT_S), "no commit began"


async def test_puts_queued_while_a_group_commits_form_the_next_group(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = _HeldCommits(store, monkeypatch)
    puts = SmallPuts(store)
    first, first_local = await puts.put(SmallPut("ds", "k0", b"bytes 0"))
    await _entered(commits)
    assert not first_local.done() and store.head("ds", "k0") is None  # stamped, not durable
    queued = [await puts.put(SmallPut("ds", f"k{n}", b"bytes %d" % n)) for n in range(1, 8)]
    commits.go.set()
    assert await asyncio.wait_for(first_local, TIMEOUT_S) == first
    for version, local in queued:
        assert await asyncio.wait_for(local, TIMEOUT_S) == version
    assert commits.groups == [["k0"], [f"k{n}" for n in range(1, 8)]]
    assert puts.groups == 2 and puts.waited == 0
    assert [store.read_bytes("ds", f"k{n}") for n in range(8)] == [
        b"bytes %d" % n for n in range(8)
    ]


async def test_a_put_of_an_object_being_written_waits_for_it_and_comes_after(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = _HeldCommits(store, monkeypatch)
    puts = SmallPuts(store)
    first, first_local = await puts.put(SmallPut("ds", "k", b"first"))
    await _entered(commits)
    second = asyncio.ensure_future(puts.put(SmallPut("ds", "k", b"second")))
    await until(lambda: puts.waited == 1, TIMEOUT_S, what="the second put to wait")
    # It waits in a thread for k's lock, which the first holds until its commit ends.
    assert store._stripes[stripe_of("ds", "k")].locked() and not second.done()
    commits.go.set()
    version, local = await asyncio.wait_for(second, TIMEOUT_S)
    assert await asyncio.wait_for(local, TIMEOUT_S) == version
    assert await first_local == first
    assert [v.version for v in store.versions("ds", "k")] == [version, first]
    assert store.read_bytes("ds", "k") == b"second"


async def test_a_bad_put_is_refused_with_nothing_kept(store: ObjectStore) -> None:
    puts = SmallPuts(store)
    with pytest.raises(DigestMismatchError, match="not the stated"):
        await puts.put(SmallPut("ds", "k", b"data", expected_digest=Digest.of(b"else")))
    assert store.head("ds", "k") is None
    version, local = await puts.put(SmallPut("ds", "k", b"data"))  # its lock was let go
    assert await asyncio.wait_for(local, TIMEOUT_S) == version


async def test_a_caller_that_stops_waiting_leaves_its_write_to_commit(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = _HeldCommits(store, monkeypatch)
    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    puts = SmallPuts(store)
    version, local = await puts.put(SmallPut("ds", "k", b"data"))
    await _entered(commits)
    local.cancel()  # as a cancelled caller's shield would leave it: nobody waits
    commits.go.set()
    _, other = await puts.put(SmallPut("ds", "other", b"more"))
    await asyncio.wait_for(other, TIMEOUT_S)  # the group after k's: k's has ended
    assert store.head("ds", "k") == version and store.read_bytes("ds", "k") == b"data"
    assert loop_errors == []  # its outcome was not forced on the cancelled future


async def test_the_committer_thread_stops_when_idle_and_starts_again(store: ObjectStore) -> None:
    puts = SmallPuts(store, idle_s=0.01)

    def committers() -> int:
        return sum(t.name == f"small puts of {store.root}" for t in threading.enumerate())

    for key in ("a", "b"):
        assert committers() == 0
        version, local = await puts.put(SmallPut("ds", key, key.encode()))
        assert await asyncio.wait_for(local, TIMEOUT_S) == version
        await until(lambda: committers() == 0, TIMEOUT_S, what="the idle committer to stop")
    assert store.read_bytes("ds", "a") == b"a" and store.read_bytes("ds", "b") == b"b"


async def test_puts_held_when_the_store_closes_are_each_refused(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = _HeldCommits(store, monkeypatch)
    puts = SmallPuts(store)
    first = await puts.put(SmallPut("ds", "k0", b"x"))
    await _entered(commits)
    queued = [await puts.put(SmallPut("ds", f"k{n}", b"x")) for n in (1, 2)]
    await asyncio.to_thread(store.close)
    commits.go.set()
    errors = []
    for _, local in [first, *queued]:
        with pytest.raises(Exception, match="closed") as caught:
            await asyncio.wait_for(local, TIMEOUT_S)
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 3  # each write its own error object
    assert isinstance(first[0], Version)


async def test_a_set_completed_while_a_member_s_put_is_queued_does_not_stall_the_committer(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning for a set a group completed takes its members' object locks; one may be
    held by a put queued behind that group, which only the committer thread commits:
    so the pruning is not done by that thread (it used to wait there for ever)."""
    c0 = store.put_small("ds", "c", b"c0")
    commits = _HeldCommits(store, monkeypatch)
    puts = SmallPuts(store)
    a, a_local = await puts.put(SmallPut("ds", "a", b"a1", set_id="s"))
    await _entered(commits)
    await asyncio.to_thread(
        store.apply_set, "ds", "s", store.clock.now(), {"a": a.hlc, "c": c0.hlc}
    )
    c, c_local = await puts.put(SmallPut("ds", "c", b"c1"))  # queued, holding c's lock
    commits.go.set()
    assert await asyncio.wait_for(a_local, TIMEOUT_S) == a
    assert await asyncio.wait_for(c_local, TIMEOUT_S) == c
    assert store.get_set("ds").set_id == "s" and store.read_bytes("ds", "c") == b"c1"


async def test_a_put_with_no_committer_thread_is_refused_and_lets_go(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread (test)")

    puts = SmallPuts(store)
    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(UnavailableError, match="no committer thread"):
            await puts.put(SmallPut("ds", "k", b"data"))
    assert not store._stripes[stripe_of("ds", "k")].locked()
    assert store.head("ds", "k") is None
    version, local = await puts.put(SmallPut("ds", "k", b"data"))  # the next put tries again
    assert await asyncio.wait_for(local, TIMEOUT_S) == version


async def test_a_waiting_put_refused_before_its_stamp_is_answered(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread path (its object's lock was held): an error before its stamp reaches
    the caller instead of leaving it waiting (here: the store closed meanwhile)."""
    monkeypatch.setattr(store, "stamp_small", lambda checked: None)
    puts = SmallPuts(store)
    store.close()
    with pytest.raises(UnavailableError, match="closed"):
        await asyncio.wait_for(puts.put(SmallPut("ds", "k", b"data")), TIMEOUT_S)
    assert puts.waited == 1


async def test_a_put_that_waits_for_its_object_is_hashed_once_and_still_checked(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put of an object being written commits through the thread path with the bytes
    checked on the loop: hashed once, and a wrong digest still refused there."""
    hashed: list[str] = []
    real = store_module.checked_bytes

    def counted(dataset: str, key: str, *args: object, **kwargs: object) -> Digest:
        hashed.append(key)
        return real(dataset, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "checked_bytes", counted)
    commits = _HeldCommits(store, monkeypatch)
    puts = SmallPuts(store)
    _, first = await puts.put(SmallPut("ds", "k", b"first"))
    await _entered(commits)
    second = SmallPut("ds", "k", b"second", expected_digest=Digest.of(b"second"))
    waiting = asyncio.create_task(puts.put(second))
    await until(lambda: puts.waited == 1, TIMEOUT_S, "the second put to wait for the first")
    bad = SmallPut("ds", "k", b"third", end_digest=Digest.of(b"else"))
    with pytest.raises(DigestMismatchError):
        await puts.put(bad)
    commits.go.set()
    await asyncio.wait_for(first, TIMEOUT_S)
    version, local = await asyncio.wait_for(waiting, TIMEOUT_S)
    assert await asyncio.wait_for(local, TIMEOUT_S) == version
    assert hashed == ["k", "k", "k"]  # once per put, the refused one included
    assert store.read_bytes("ds", "k") == b"second" and puts.waited == 1
