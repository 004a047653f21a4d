"""Threads writing one object: the newest HLC wins and no reader ever sees a partial or
mixed file. Also the async front (`put_stream`)."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from store_helpers import StoreFactory, object_files

from agents.store import ObjectStore, files
from agents.store.aio import put_stream
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Version
from controlplane.errors import NotFoundError

WRITERS = 6
PUTS_EACH = 8
DEADLINE_S = 60


def _content(writer: int, i: int) -> bytes:
    # Each version is one repeated byte pattern, so a mix of two would show.
    return bytes([writer * PUTS_EACH + i]) * (300_000 + 4096 * i)


def test_threads_writing_one_object(open_store: StoreFactory) -> None:
    store = open_store(keep_versions=2)
    store.put("ds", "k", [b"seed"])
    stop = threading.Event()
    reads: list[int] = []
    bad: list[str] = []

    def reader() -> None:
        deadline = time.monotonic() + DEADLINE_S
        for _ in range(100_000):
            if stop.is_set() or time.monotonic() > deadline:
                return
            with store.open("ds", "k") as r:
                data = r.read_all()
                if len(data) != r.version.size or Digest.of(data) != r.version.digest:
                    bad.append(f"{len(data)} bytes at {r.version.hlc}")
                reads.append(len(data))

    def writer(w: int) -> list[Version]:
        made = []
        for i in range(PUTS_EACH):
            data = _content(w, i)
            step = 65_536
            chunks = (data[j : j + step] for j in range(0, len(data), step))
            made.append(store.put("ds", "k", chunks))
        return made

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    with ThreadPoolExecutor(WRITERS) as pool:
        results = list(pool.map(writer, range(WRITERS)))
    stop.set()
    for t in readers:
        t.join(DEADLINE_S)
    made = [v for vs in results for v in vs]
    assert bad == []
    assert len(reads) > 0
    assert len({v.hlc for v in made}) == len(made)  # every commit got its own HLC
    top = max(made, key=lambda v: v.hlc)
    assert store.head("ds", "k") == top
    assert [s.version for s in store.versions("ds", "k")] == sorted(
        made, key=lambda v: v.hlc, reverse=True
    )[:2]
    assert len(object_files(store.root)) == 2
    # Commit order (the journal's) is HLC order: the last commit of an object is its newest.
    committed = [j.hlc or "" for j in store.journal_pending() if j.kind == "version"]
    assert committed == sorted(committed) and len(committed) == len(made) + 1
    assert os.listdir(store.root / "tmp") == []


def test_threads_applying_remote_versions_in_any_order(store: ObjectStore) -> None:
    base = system_ms() - 10_000
    rnd = random.Random(7)
    versions = []
    for n in range(40):
        data = f"remote {n}".encode()
        hlc = HLC(base + rnd.randrange(1000), rnd.randrange(10), rnd.choice(["us-east", "ap-x"]))
        versions.append((Version.put(hlc, len(data), Digest.of(data)), data))
    unique = {v.hlc: (v, d) for v, d in versions}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda vd: store.apply("ds", "k", vd[0], [vd[1]]), unique.values()))
    top = max(unique)
    assert store.head("ds", "k") == unique[top][0]
    assert store.read_bytes("ds", "k") == unique[top][1]


async def _chunks(data: bytes, fail_after: int | None = None) -> AsyncIterator[bytes]:
    for n, start in enumerate(range(0, len(data), 100_000)):
        if fail_after is not None and n == fail_after:
            raise ConnectionResetError("stream cut")
        await asyncio.sleep(0)
        yield data[start : start + 100_000]


async def test_put_stream_from_an_async_iterable(store: ObjectStore) -> None:
    data = os.urandom(1_000_000)
    version = await put_stream(store, "ds", "k", _chunks(data), expected_size=len(data))
    assert version.digest == Digest.of(data)
    assert await asyncio.to_thread(store.read_bytes, "ds", "k") == data
    with pytest.raises(ConnectionResetError):
        await put_stream(store, "ds", "cut", _chunks(data, fail_after=3))
    with pytest.raises(NotFoundError):
        store.stat("ds", "cut")
    assert os.listdir(store.root / "tmp") == []


async def test_a_cancelled_put_stream_stores_nothing(store: ObjectStore) -> None:
    started = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"first chunk"
        started.set()
        await asyncio.Event().wait()  # never set: the stream stalls until cancelled
        yield b"never"

    task = asyncio.create_task(put_stream(store, "ds", "k", slow()))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.head("ds", "k") is None
    assert os.listdir(store.root / "tmp") == []


def test_a_bundles_new_folders_are_made_under_the_mkdir_lock(tmp_path: Path) -> None:
    # A single write (make_dirs) takes the lock and skips a folder that exists: a
    # bundle's folders must not exist before their entries are durable, so they are
    # made under the same lock, and a write waits for their fsync.
    made = threading.Event()

    def make() -> None:
        files.make_children(tmp_path, ["aa", "bb"])
        made.set()

    with files._mkdir_lock:
        worker = threading.Thread(target=make)
        worker.start()
        assert not made.wait(0.2)
        assert not (tmp_path / "aa").exists()  # nothing made while another holds it
    worker.join(10)
    assert made.is_set() and (tmp_path / "aa").is_dir() and (tmp_path / "bb").is_dir()
