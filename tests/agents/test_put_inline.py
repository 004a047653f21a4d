"""The Put handler's small-write path (agents/service/servicer.py, `INLINE_BYTES`): a
Put that ends within the bytes held in memory is stored in one thread hop after its
end and handed to the replication hook with its bytes (pushed from memory); a larger
one is staged with the bytes held so far and streams on, bit-exact either way. A small
critical Put is handed on (pushed) as soon as it has its HLC, while it commits, and
answered only once that commit is done."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    REGION,
    STANDARD,
    TIMEOUT_S,
    Agent,
    frames,
    get,
    header,
)
from blake3 import blake3

from agents.service.servicer import INLINE_BYTES, CommittedWrite
from agents.store import StorageError
from meridian.v1 import agent_pb2

KiB = 1 << 10


async def put_chunks(
    agent: Agent, dataset: str, key: str, chunks: list[bytes], **fields: object
) -> agent_pb2.PutResponse:
    resp: agent_pb2.PutResponse = await agent.stub.Put(
        frames(dataset, key, chunks, **fields), timeout=TIMEOUT_S
    )
    return resp


async def test_a_small_critical_put_is_handed_on_with_its_bytes(agent: Agent) -> None:
    data = os.urandom(KiB)
    digest = "blake3:" + blake3(data).hexdigest()
    resp = await put_chunks(agent, CRITICAL, "small", [data[:100], data[100:]], digest=digest)
    (write,) = agent.replication.writes
    assert write.key == "small" and write.data == data
    assert write.version is not None and write.version.hlc.text == resp.version.hlc
    _, body = await get(agent, CRITICAL, "small")
    assert body == data
    assert not list((agent.root / "tmp").glob("*.part"))


@pytest.mark.parametrize("sizes", [[INLINE_BYTES + 1], [30 * KiB, 30 * KiB, 30 * KiB]])
async def test_a_put_past_what_is_held_is_staged_with_the_held_bytes_first(
    agent: Agent, sizes: list[int]
) -> None:
    chunks = [os.urandom(n) for n in sizes]
    data = b"".join(chunks)
    resp = await put_chunks(agent, CRITICAL, "large", chunks)
    assert resp.version.size == len(data)
    assert resp.version.digest == "blake3:" + blake3(data).hexdigest()
    (write,) = agent.replication.writes
    assert write.data is None  # read back from the store when pushed
    _, body = await get(agent, CRITICAL, "large")
    assert body == data


async def test_a_small_put_with_a_wrong_stated_digest_stores_nothing(agent: Agent) -> None:
    wrong = "blake3:" + blake3(b"other bytes").hexdigest()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(
            frames(STANDARD, "k", [b"small bytes"], end=False, digest=wrong), timeout=TIMEOUT_S
        )
    # No end: refused as a short stream, before anything is staged.
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await put_chunks(agent, STANDARD, "k", [b"small bytes"], digest=wrong)
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    assert agent.files() == []
    assert agent.store.list_objects(STANDARD, include_deleted=True).items == []


class Overlapping:
    """A replication hook that lets the owner's commit finish only once it was handed
    the write, then waits for that commit as the real one does."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.pending_when_handed: bool | None = None

    async def replicate(self, write: CommittedWrite) -> tuple[str, ...]:
        self.pending_when_handed = write.local is not None and not write.local.done()
        self.release.set()
        assert write.local is not None
        await write.local
        return (REGION, "eu-central")


async def test_a_small_critical_put_is_pushed_while_it_commits_and_acked_after(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = Overlapping()
    agent.service.replication = hook
    install = agent.store._install_entries

    def held_commit(*args: Any, **kwargs: Any) -> Any:
        # The commit waits for the hand-on (bounded: without the overlap it never comes,
        # and the assertion below says so).
        hook.release.wait(timeout=5)
        return install(*args, **kwargs)

    monkeypatch.setattr(agent.store, "_install_entries", held_commit)
    data = os.urandom(KiB)
    resp = await put_chunks(agent, CRITICAL, "overlap", [data])
    assert hook.pending_when_handed is True
    assert list(resp.regions) == [REGION, "eu-central"]
    _, body = await get(agent, CRITICAL, "overlap")
    assert body == data  # committed before it was answered


async def test_a_failed_local_commit_fails_the_overlapped_write(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = Overlapping()
    agent.service.replication = hook

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        hook.release.wait(timeout=5)
        raise StorageError("the disk is gone (test)")

    monkeypatch.setattr(agent.store, "_install_entries", failing)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await put_chunks(agent, CRITICAL, "lost", [b"never stored"])
    assert caught.value.code() != grpc.StatusCode.OK
    assert "the disk is gone" in (caught.value.details() or "")
    assert hook.pending_when_handed is True
    assert agent.store.list_objects(CRITICAL, include_deleted=True).items == []


def size_of(path: str) -> int:
    return os.stat(path).st_size


async def test_a_small_put_is_kept_in_the_store_s_database_and_a_larger_one_in_a_file(
    agent: Agent,
) -> None:
    """A Put whose bytes are all held (at most INLINE_BYTES) is kept inline in the
    store's database (`ObjectStore.put_small`): no file of its own to create, rename
    and sync; its change event and a read serve the same bytes as a file's would."""
    small, large = os.urandom(KiB), os.urandom(INLINE_BYTES + 1)
    resp = await put_chunks(agent, STANDARD, "small", [small[:10], small[10:]])
    assert resp.version.digest == "blake3:" + blake3(small).hexdigest()
    assert agent.files() == []
    await put_chunks(agent, STANDARD, "large", [large])
    (stored,) = agent.files()
    assert size_of(stored) == len(large)
    _, body = await get(agent, STANDARD, "small")
    assert body == small
    assert agent.store.read_bytes(STANDARD, "small") == small
    events = agent.store.outbox_pending(limit=10)
    assert [e.key for e in events] == ["small", "large"]
    await put_chunks(agent, STANDARD, "small", [large[:KiB]])  # a second version
    assert agent.store.read_bytes(STANDARD, "small") == large[:KiB]
    assert len(agent.files()) == 1


async def ended_with(
    dataset: str, key: str, data: bytes, end_digest: str, **fields: object
) -> AsyncIterator[agent_pb2.PutRequest]:
    yield header(dataset, key, **fields)
    yield agent_pb2.PutRequest(chunk=data)
    yield agent_pb2.PutRequest(end=agent_pb2.PutEnd(digest=end_digest))


@pytest.mark.parametrize(
    ("stated", "code"),
    [
        (-1, grpc.StatusCode.RESOURCE_EXHAUSTED),  # longer than its stated size
        (+1, grpc.StatusCode.INVALID_ARGUMENT),  # shorter than its stated size
        (0, grpc.StatusCode.DATA_LOSS),  # the right size: the end's digest is wrong
    ],
)
async def test_a_small_put_is_refused_as_a_large_one_is(
    agent: Agent, stated: int, code: grpc.StatusCode
) -> None:
    """A Put kept inline checks its bytes in the order a staged one does (its stated
    size, then the digest stated at its end): the same code whatever its size."""
    wrong = "blake3:" + blake3(b"other bytes").hexdigest()
    for n, size in enumerate((KiB, INLINE_BYTES + KiB)):
        data = os.urandom(size)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await agent.stub.Put(
                ended_with(STANDARD, f"k{n}", data, wrong, size=size + stated),
                timeout=TIMEOUT_S,
            )
        assert caught.value.code() == code, (size, caught.value.details())
    assert agent.files() == []
    assert agent.store.list_objects(STANDARD, include_deleted=True).items == []
