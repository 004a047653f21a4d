"""Group commit of single writes (agents/store/group.py): concurrent writers share folder
fsyncs and one SQLite transaction, each returns once its own write is durable, a bad
write fails alone, and one object's writes keep their order."""

from __future__ import annotations

import errno
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from store_helpers import StoreFactory, object_files, remote

from agents.store import DigestMismatchError, ObjectStore, StorageError, files
from agents.store.group import GroupCommitter
from agents.store.names import version_path
from agents.store.store import stripe_of
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Digest
from controlplane.errors import InvalidInputError
from controlplane.settings import load_settings

DEADLINE_S = 30.0


def _content(key: str) -> bytes:
    return (key.encode() + b"|") * 40  # about 1 KiB, different per key


def _wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _distinct_stripes(*keys: str) -> None:
    """Writers held behind a leader must not share an object lock stripe (the second
    would wait for the first's commit instead of queueing): stripes are a CRC of the
    name, the same in every run, so this holds or fails deterministically."""
    stripes = [stripe_of("ds", key) for key in keys]
    assert len(set(stripes)) == len(stripes), "pick other test keys: two share a stripe"


@contextmanager
def _held_leader(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[int], None]]:
    """Hold the first group's leader at its first folder fsync until released, so that the
    writes started meanwhile all queue up and form the next group (deterministically).
    Yields `release(n)`: wait until `n` writes are queued, then let the leader go."""
    real = files.fsync_dir
    reached, go = threading.Event(), threading.Event()

    def fsync_dir(path: Path) -> None:
        if path.parent.name == "objects" and not reached.is_set():  # a fan-out folder
            reached.set()
            if not go.wait(DEADLINE_S):
                raise AssertionError("the test never released the leader")
        real(path)

    monkeypatch.setattr(files, "fsync_dir", fsync_dir)

    def release(n: int) -> None:
        _wait_for(f"{n} queued writes", lambda: store.group_queued() >= n)
        go.set()

    try:
        yield release
    finally:
        go.set()
    assert reached.is_set(), "no group reached its folder fsync"


def test_lone_writer_commits_at_once_one_write_per_group(open_store: StoreFactory) -> None:
    store = open_store()
    for i in range(5):
        store.put("ds", f"k{i}", [_content(f"k{i}")])
    stats = store.group_stats()
    assert (stats.groups, stats.items) == (5, 5)


def test_concurrent_writers_share_groups_all_durable_and_correct(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = open_store()
    keys = [f"w{n}" for n in range(24)]
    _distinct_stripes(*keys)
    with _held_leader(store, monkeypatch) as release, ThreadPoolExecutor(len(keys)) as pool:
        first = pool.submit(store.put, "ds", keys[0], [_content(keys[0])], outbox=True)
        _wait_for("the first leader", lambda: store.group_stats().groups == 1)
        rest = [pool.submit(store.put, "ds", key, [_content(key)], outbox=True) for key in keys[1:]]
        release(len(rest))
        versions = [first.result(DEADLINE_S)] + [f.result(DEADLINE_S) for f in rest]
    stats = store.group_stats()
    assert (stats.groups, stats.items) == (2, len(keys))  # the held one, then all the rest
    assert len({v.hlc for v in versions}) == len(keys)
    store.close()
    with ObjectStore(store.root, clock=store.clock) as again:  # what survived is on disk
        assert again.repair_report.orphans_removed == 0
        for key, version in zip(keys, versions, strict=True):
            assert again.head("ds", key) == version
            assert again.read_bytes("ds", key) == _content(key)
        assert sorted(e.key or "" for e in again.outbox_pending(100)) == sorted(keys)
        kinds = [(j.kind, j.key) for j in again.journal_pending()]
        assert sorted(kinds) == sorted(("version", key) for key in keys)
        assert len(object_files(again.root)) == len(keys)
        assert os.listdir(again.root / "tmp") == []


def test_applies_and_deletes_group_with_puts(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    store.put("ds", "doomed", [b"x"])
    newer = remote(b"from afar", ago_ms=-5)  # newer than anything held
    older_than_held = remote(b"stale", ago_ms=60_000)
    store.apply("ds", "stale", remote(b"held", ago_ms=1000), [b"held"])
    _distinct_stripes("p0", "far", "doomed", "p1")
    with _held_leader(store, monkeypatch) as release, ThreadPoolExecutor(8) as pool:
        first = pool.submit(store.put, "ds", "p0", [b"p0"])
        _wait_for("the first leader", lambda: store.group_stats().groups == 3)
        applied = pool.submit(store.apply, "ds", "far", newer, [b"from afar"])
        deleted = pool.submit(store.delete, "ds", "doomed")
        put = pool.submit(store.put, "ds", "p1", [b"p1"])
        release(3)
        lost = pool.submit(store.apply, "ds", "stale", older_than_held, [b"stale"])
        results = (applied.result(DEADLINE_S), deleted.result(DEADLINE_S), put.result(DEADLINE_S))
        assert lost.result(DEADLINE_S).verdict.value == "older"  # LWW: a no-op, as ever
        first.result(DEADLINE_S)
    assert results[0].verdict.applies and store.read_bytes("ds", "far") == b"from afar"
    assert store.head("ds", "doomed") == results[1] and results[1].is_tombstone
    assert store.read_bytes("ds", "p1") == b"p1"
    assert store.read_bytes("ds", "stale") == b"held"
    # doomed, held, p0 (held at its fsync), then the three queued behind it; the stale
    # apply lost by LWW and wrote nothing.
    assert (store.group_stats().groups, store.group_stats().items) == (4, 6)


def test_a_bad_row_in_a_group_fails_only_its_write(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    keys = [f"g{n}" for n in range(6)]
    _distinct_stripes("first", "bad", *keys)
    bad = {"unserialisable": object()}  # the journal row cannot be written
    with _held_leader(store, monkeypatch) as release, ThreadPoolExecutor(8) as pool:
        first = pool.submit(store.put, "ds", "first", [b"first"])
        _wait_for("the first leader", lambda: store.group_stats().groups == 1)
        good = [pool.submit(store.put, "ds", key, [_content(key)]) for key in keys]
        wrong = pool.submit(store.put, "ds", "bad", [b"bad bytes"], transfer=bad)
        release(len(keys) + 1)
        with pytest.raises(StorageError, match="ds/bad"):
            wrong.result(DEADLINE_S)
        versions = [f.result(DEADLINE_S) for f in good]
        first.result(DEADLINE_S)
    assert store.group_stats().items == len(keys) + 2
    for key, version in zip(keys, versions, strict=True):
        assert store.head("ds", key) == version
        assert store.read_bytes("ds", key) == _content(key)
    assert store.head("ds", "bad") is None
    assert not any(j.key == "bad" for j in store.journal_pending())
    # Its file went with its rows: only the good ones' files are left.
    assert len(object_files(store.root)) == len(keys) + 1
    assert os.listdir(store.root / "tmp") == []


def test_a_failed_folder_fsync_fails_only_the_writes_into_it(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    keys = [f"f{n}" for n in range(8)]
    _distinct_stripes("first", *keys)
    victim = keys[3]
    hlc = remote(b"").hlc  # the folder depends on the name only

    def folder_of(key: str) -> str:
        return version_path("ds", key, hlc).parent.name

    victim_folder = folder_of(victim)
    assert [k for k in [*keys, "first"] if folder_of(k) == victim_folder] == [victim]
    with _held_leader(store, monkeypatch) as release:
        real = files.fsync_dir  # the gate of _held_leader, which calls the real one

        def fsync_dir(path: Path) -> None:
            if path.name == victim_folder:
                raise OSError(errno.EIO, "Input/output error")
            real(path)

        monkeypatch.setattr(files, "fsync_dir", fsync_dir)
        with ThreadPoolExecutor(len(keys) + 1) as pool:
            first = pool.submit(store.put, "ds", "first", [b"first"])
            _wait_for("the first leader", lambda: store.group_stats().groups == 1)
            futures = {key: pool.submit(store.put, "ds", key, [_content(key)]) for key in keys}
            release(len(keys))
            with pytest.raises(StorageError, match=f"ds/{victim}.*Input/output error"):
                futures[victim].result(DEADLINE_S)
            for key in keys:
                if key != victim:
                    assert store.read_bytes("ds", key) == _content(key)
            first.result(DEADLINE_S)
    assert store.head("ds", victim) is None
    assert len(object_files(store.root)) == len(keys)  # the 7 good ones and "first"


def test_refused_writes_among_a_group_fail_alone(open_store: StoreFactory) -> None:
    """Errors found before the commit (a digest mismatch, a bad name, LWW) stay their
    writer's, while the writes around them commit."""
    store = open_store()
    store.apply("ds", "held", remote(b"newest", ago_ms=10), [b"newest"])

    def write(n: int) -> object:
        if n % 4 == 1:
            return store.put("ds", f"k{n}", [b"abc"], expected_digest=Digest.of(b"other"))
        if n % 4 == 2:
            return store.put("ds", f"../k{n}", [b"abc"])
        if n % 4 == 3:
            return store.apply("ds", "held", remote(b"old", ago_ms=50_000), [b"old"])
        return store.put("ds", f"k{n}", [_content(f"k{n}")])

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(write, n) for n in range(64)]
        for n, future in enumerate(futures):
            if n % 4 == 1:
                with pytest.raises(DigestMismatchError):
                    future.result(DEADLINE_S)
            elif n % 4 == 2:
                with pytest.raises(InvalidInputError, match="key"):
                    future.result(DEADLINE_S)
            elif n % 4 == 3:
                assert future.result(DEADLINE_S).verdict.value == "older"
            else:
                assert future.result(DEADLINE_S).size == len(_content(f"k{n}"))
                assert store.read_bytes("ds", f"k{n}") == _content(f"k{n}")
    assert store.read_bytes("ds", "held") == b"newest"
    assert len(object_files(store.root)) == 16 + 1
    assert os.listdir(store.root / "tmp") == []


def test_one_objects_writes_keep_their_order(open_store: StoreFactory) -> None:
    """Writers of one object among writers of others: each object's commits (journal
    order) come in HLC order, so the last commit is the newest, as without groups."""
    store = open_store(keep_versions=3)
    hot = [f"hot{n}" for n in range(3)]

    def writer(n: int) -> list[tuple[str, str]]:
        out = []
        for i in range(12):
            key = hot[(n + i) % len(hot)] if i % 2 == 0 else f"cold{n}-{i}"
            version = store.put("ds", key, [f"{n}-{i}".encode()])
            out.append((key, version.hlc.text))
        return out

    with ThreadPoolExecutor(12) as pool:
        written = [w for f in [pool.submit(writer, n) for n in range(12)] for w in f.result(60)]
    for key in hot:
        mine = sorted(h for k, h in written if k == key)
        committed = [
            j.hlc for j in store.journal_pending(10_000) if j.key == key and j.kind == "version"
        ]
        assert committed == mine  # commit order == HLC order, none lost
        assert store.head("ds", key).hlc.text == mine[-1]
        assert [s.version.hlc.text for s in store.versions("ds", key)] == mine[::-1][:3]
    assert store.group_stats().items == len(written)


def test_group_commit_off_commits_one_by_one(open_store: StoreFactory) -> None:
    store = open_store(group_commit=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.put("ds", f"k{n}", [b"x"]), range(16)))
    assert store.group_stats().groups == 0
    assert len(object_files(store.root)) == 16


def test_committer_gives_each_item_its_own_outcome() -> None:
    """The committer alone: a lone submit leads at once; items queued behind a commit in
    flight form the next group; an item's error reaches only its submitter."""
    gate, entered = threading.Event(), threading.Event()
    groups: list[list[int]] = []

    def commit(items: object) -> list[int | BaseException]:
        batch = list(items)  # type: ignore[call-overload]
        groups.append(batch)
        if len(groups) == 1:
            entered.set()
            assert gate.wait(DEADLINE_S)
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in batch]

    committer: GroupCommitter[int, int] = GroupCommitter(commit)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(committer.submit, 1)
        assert entered.wait(DEADLINE_S)
        rest = [pool.submit(committer.submit, i) for i in (2, -3, 4, 5)]
        _wait_for("four queued", lambda: committer.queued() == 4)
        gate.set()
        assert first.result(DEADLINE_S) == 10
        assert [f.exception(DEADLINE_S) is None for f in rest] == [True, False, True, True]
        assert str(rest[1].exception()) == "bad -3"
        assert [f.result() for f in (rest[0], rest[2], rest[3])] == [20, 40, 50]
    assert groups == [[1], [2, -3, 4, 5]]
    assert committer.stats().groups == 2 and committer.stats().items == 5


def test_committer_caps_the_group_size() -> None:
    gate, entered = threading.Event(), threading.Event()
    groups: list[list[int]] = []

    def commit(items: object) -> list[int | BaseException]:
        groups.append(list(items))  # type: ignore[call-overload]
        if len(groups) == 1:
            entered.set()
            assert gate.wait(DEADLINE_S)
        return list(items)  # type: ignore[call-overload]

    committer: GroupCommitter[int, int] = GroupCommitter(commit, max_group=2)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(committer.submit, 0)
        assert entered.wait(DEADLINE_S)
        rest = [pool.submit(committer.submit, i) for i in range(1, 6)]
        _wait_for("five queued", lambda: committer.queued() == 5)
        gate.set()
        assert [first.result(DEADLINE_S)] + [f.result(DEADLINE_S) for f in rest] == list(range(6))
    assert groups[0] == [0] and all(len(g) <= 2 for g in groups)
    assert sorted(i for g in groups for i in g) == list(range(6))


class _HeldFirst:
    """A commit function that records its groups and holds the first until `gate` is
    set; the first then raises `first_raises` if given, later groups `later_raises`,
    else each item's outcome is `outcome(item)` (by default the item itself)."""

    def __init__(
        self,
        *,
        first_raises: BaseException | None = None,
        later_raises: BaseException | None = None,
        outcome: Callable[[int], int | BaseException] = lambda i: i,
    ) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.groups: list[list[int]] = []
        self.first_raises, self.later_raises = first_raises, later_raises
        self.outcome = outcome

    def __call__(self, items: object) -> list[int | BaseException]:
        self.groups.append(list(items))  # type: ignore[call-overload]
        if len(self.groups) == 1:
            self.entered.set()
            assert self.gate.wait(DEADLINE_S)
            if self.first_raises is not None:
                raise self.first_raises
        elif self.later_raises is not None:
            raise self.later_raises
        return [self.outcome(i) for i in self.groups[-1]]


class _Writers:
    """Writers of `committer` on daemon threads, each outcome recorded (its result, or
    what it raised): a writer left waiting fails the test instead of hanging it."""

    def __init__(self, committer: GroupCommitter[int, int]) -> None:
        self.committer = committer
        self.outcomes: dict[int, object] = {}

    def start(self, *items: int) -> None:
        for i in items:
            threading.Thread(target=self._write, args=(i,), daemon=True).start()

    def _write(self, i: int) -> None:
        try:
            self.outcomes[i] = self.committer.submit(i)
        except BaseException as exc:  # noqa: BLE001 - what it raised is its outcome
            self.outcomes[i] = exc

    def queue_behind_first(self, commit: _HeldFirst, *items: int) -> None:
        """Writer 0 leads and is held in its commit while `items` queue behind it."""
        self.start(0)
        assert commit.entered.wait(DEADLINE_S)
        self.start(*items)
        _wait_for(f"{len(items)} queued", lambda: self.committer.queued() == len(items))

    def answered(self, *items: int) -> None:
        _wait_for(f"writers {items} answered", lambda: all(i in self.outcomes for i in items))


def test_an_interrupted_leader_hands_the_next_group_on() -> None:
    """A leader interrupted in its commit raises; a writer queued meanwhile still leads
    the next group (woken writers are handed the lead one by one, so a lead dropped
    would leave them waiting)."""
    commit = _HeldFirst(first_raises=KeyboardInterrupt())
    writers = _Writers(GroupCommitter(commit, max_group=2))
    writers.queue_behind_first(commit, 1, 2, 3)
    commit.gate.set()
    writers.answered(0, 1, 2, 3)
    outcomes = writers.outcomes
    assert isinstance(outcomes.pop(0), KeyboardInterrupt)
    assert outcomes == {1: 1, 2: 2, 3: 3}
    groups = commit.groups
    assert groups[0] == [0] and sorted(i for g in groups[1:] for i in g) == [1, 2, 3]


class _StopError(Exception):
    """Raised by a signal handler in the main thread, as a Ctrl-C would."""


def test_a_writer_that_stops_waiting_leaves_the_queue_and_the_rest_go_on() -> None:
    """A writer interrupted while it waits for its group (a signal in the main thread)
    leaves the queue, not committed; the lead is not left with it, so later writers
    still commit."""
    commit = _HeldFirst()
    committer: GroupCommitter[int, int] = GroupCommitter(commit)
    writers = _Writers(committer)

    def stop(signum: int, frame: object) -> None:
        raise _StopError

    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def interrupt_main() -> None:
        _wait_for("the main thread queued", lambda: committer.queued() == 1)
        signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        writers.start(0)
        assert commit.entered.wait(DEADLINE_S)
        threading.Thread(target=interrupt_main, daemon=True).start()
        with pytest.raises(_StopError):
            committer.submit(1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert committer.queued() == 0
    commit.gate.set()
    writers.answered(0)
    writers.start(2)
    writers.answered(2)
    assert writers.outcomes == {0: 0, 2: 2} and commit.groups == [[0], [2]]


def test_a_failed_groups_items_are_freed_without_the_collector() -> None:
    """A commit error reaches each writer with no reference cycle back to the group:
    the items (inline bytes in the store) are freed as soon as the writers drop the
    error, not at the collector's next pass (agents run it rarely, daemon/runtime.py)."""

    class Item:
        pass

    def commit(items: object) -> list[int | BaseException]:
        raise OSError("disk full")

    committer: GroupCommitter[Item, int] = GroupCommitter(commit)
    refs = []
    gc.disable()
    try:
        for _ in range(3):
            item = Item()
            refs.append(weakref.ref(item))
            with pytest.raises(OSError, match="disk full"):
                committer.submit(item)
            del item
        assert [r() for r in refs] == [None, None, None]
    finally:
        gc.enable()


def test_a_leader_interrupted_before_its_commit_tells_its_group_and_hands_on() -> None:
    """A signal landing in a leader after it took its group but before the commit
    (here: as `_run` begins): its group's other writers are told their write may not
    be stored (not left undone, to lead again with nothing queued), and a later writer
    still commits."""

    class Interrupted(GroupCommitter[int, int]):
        runs = 0

        def _run(self, group: list[Any]) -> None:
            Interrupted.runs += 1
            if Interrupted.runs == 2:
                raise KeyboardInterrupt
            super()._run(group)

    commit = _HeldFirst()
    writers = _Writers(Interrupted(commit))
    writers.queue_behind_first(commit, 1, 2, 3)
    commit.gate.set()
    writers.answered(0, 1, 2, 3)
    outcomes = writers.outcomes
    kinds = sorted(type(outcomes[i]).__name__ for i in (1, 2, 3))
    assert outcomes[0] == 0
    assert kinds == ["InterruptedCommitError", "InterruptedCommitError", "KeyboardInterrupt"]
    writers.start(4)
    writers.answered(4)
    assert outcomes[4] == 4 and commit.groups == [[0], [4]]


def test_the_writers_of_a_failed_group_each_get_their_own_error() -> None:
    """One error object raised by every writer of its group would gather all their
    frames in one traceback; each gets its own, of the same type and message."""
    commit = _HeldFirst(later_raises=OSError(28, "disk full"))
    writers = _Writers(GroupCommitter(commit))
    writers.queue_behind_first(commit, 1, 2, 3)
    commit.gate.set()
    writers.answered(0, 1, 2, 3)
    errors = [writers.outcomes[i] for i in (1, 2, 3)]
    assert len({id(e) for e in errors}) == 3
    assert all(isinstance(e, OSError) and e.errno == 28 and "disk full" in str(e) for e in errors)


def test_many_writers_each_return_once_their_group_is_committed() -> None:
    """64 threads, 20 writes each, a group at most 4: every write returns its own result
    and none waits for ever (each writer is woken once, by its group's leader)."""
    committed: set[int] = set()

    def commit(items: object) -> list[int | BaseException]:
        batch = list(items)  # type: ignore[call-overload]
        assert len(batch) <= 4
        committed.update(batch)
        return [i * 2 for i in batch]

    committer: GroupCommitter[int, int] = GroupCommitter(commit, max_group=4)

    def writer(n: int) -> list[int]:
        return [committer.submit(n * 20 + i) for i in range(20)]

    with ThreadPoolExecutor(64) as pool:
        results = [f.result(DEADLINE_S) for f in [pool.submit(writer, n) for n in range(64)]]
    assert results == [[2 * (n * 20 + i) for i in range(20)] for n in range(64)]
    assert committed == set(range(64 * 20))
    assert committer.stats().items == 64 * 20 and committer.queued() == 0


def test_journal_rows_of_a_group_are_valid_json(open_store: StoreFactory) -> None:
    store = open_store()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.put("ds", f"k{n}", [b"x"], transfer={"n": n}), range(16)))
    transfers = [j for j in store.journal_pending() if j.kind == "transfer"]
    assert sorted(int(j.data["n"]) for j in transfers) == list(range(16))


GROUP_CHILD = Path(__file__).with_name("group_crash_child.py")


@pytest.mark.parametrize("step", ["in-commit", "after-commit"])
def test_crash_in_a_group_leaves_only_whole_committed_writes(tmp_path: Path, step: str) -> None:
    """A child writing from 16 threads in groups is SIGKILLed inside a group of several
    writes: after restart every acked write is there, whole; the dying group's writes
    are all there (`after-commit`) or none is (`in-commit`); no file without its row."""
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, str(GROUP_CHILD), str(root), step, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)
    acked = (out / "acked").read_text().split()
    doomed = (out / "doomed").read_text().split()
    assert len(doomed) >= 2, "the child died outside a group of several writes"
    assert not set(acked) & set(doomed)
    with ObjectStore(root, clock=HybridClock("eu-west")) as store:
        report = store.repair_report
        present = {s.key for s in store.held() if not s.version.is_tombstone}
        assert set(acked) <= present
        if step == "in-commit":
            assert not present & set(doomed)
            assert report.orphans_removed >= len(doomed)  # their placed files, row-less
        else:
            assert set(doomed) <= present
        for key in present:
            assert store.read_bytes("ds", key) == _child_content(key)
        assert len(object_files(root)) == len(present)
        assert os.listdir(root / "tmp") == []
        events = {e.key for e in store.outbox_pending(1000)}
        assert events == present  # each committed write's event, none of the others


def _child_content(key: str) -> bytes:
    return (key.encode() + b"|") * 50


def test_agents_take_group_commit_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(check_endpoints=False).store_group_commit is True
    monkeypatch.setenv("MERIDIAN_STORE_GROUP_COMMIT", "0")
    assert load_settings(check_endpoints=False).store_group_commit is False


def test_a_writer_s_several_items_go_in_one_group_each_with_its_outcome() -> None:
    """`submit_many`: a slot of several items is committed in one group with the items
    queued beside it, and its writer gets each item's outcome (an error among them is
    returned, not raised); groups are cut between slots, never inside one."""
    held = _HeldFirst(outcome=lambda i: ValueError(f"bad {i}") if i < 0 else i * 10)
    committer: GroupCommitter[int, int] = GroupCommitter(held, max_group=5)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(committer.submit, 1)
        assert held.entered.wait(DEADLINE_S)
        many = pool.submit(committer.submit_many, [2, -3, 4])
        _wait_for("three queued", lambda: committer.queued() == 3)
        more = pool.submit(committer.submit_many, [5, 6, 7])
        _wait_for("six queued", lambda: committer.queued() == 6)
        held.gate.set()
        assert first.result(DEADLINE_S) == 10
        outcomes = many.result(DEADLINE_S)
        assert [outcomes[0], outcomes[2]] == [20, 40] and str(outcomes[1]) == "bad -3"
        assert more.result(DEADLINE_S) == [50, 60, 70]
    # 3 + 3 items pass the cap of 5: the second slot leads a group of its own.
    assert held.groups == [[1], [2, -3, 4], [5, 6, 7]]
    with pytest.raises(ValueError, match="1 to 5 items"):
        committer.submit_many(list(range(6)))
    with pytest.raises(ValueError, match="1 to 5 items"):
        committer.submit_many([])
