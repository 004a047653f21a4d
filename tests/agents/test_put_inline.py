"""The Put handler's small-write path (agents/service/servicer.py, `INLINE_BYTES`): a
Put that ends within the bytes held in memory is stored in one thread hop after its
end and handed to the replication hook with its bytes (pushed from memory); a larger
one is staged with the bytes held so far and streams on, bit-exact either way."""

from __future__ import annotations

import os

import grpc
import pytest
from agent_api_helpers import CRITICAL, STANDARD, TIMEOUT_S, Agent, frames, get
from blake3 import blake3

from agents.service.servicer import INLINE_BYTES
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
