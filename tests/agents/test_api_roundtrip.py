"""Put, Get, Stat, List, Delete and Health of an in-process agent on a real store."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    REGION,
    STANDARD,
    TIMEOUT_S,
    Agent,
    MiB,
    get,
    put,
)
from blake3 import blake3
from waiting import until

from meridian.v1 import agent_pb2, types_pb2


def digest_of(data: bytes) -> str:
    return "blake3:" + blake3(data).hexdigest()


@pytest.mark.parametrize(
    "size", [0, 17, MiB, 5 * MiB + 3], ids=["empty", "small", "one-chunk", "multi-chunk"]
)
async def test_put_then_get_and_stat_return_the_same_bytes_and_version(
    agent: Agent, size: int
) -> None:
    data = os.urandom(size)
    put_resp = await put(agent, STANDARD, f"obj-{size}", data)
    version = put_resp.version
    assert version.op == types_pb2.OP_PUT
    assert version.size == size
    assert version.digest == digest_of(data)
    assert version.hlc.endswith(f"@{REGION}")

    first, body = await get(agent, STANDARD, f"obj-{size}")
    assert first.header == version
    assert body == data

    stat = await agent.stub.Stat(
        agent_pb2.StatRequest(dataset=STANDARD, key=f"obj-{size}"), timeout=TIMEOUT_S
    )
    assert stat.object.version == version
    assert stat.object.dataset == STANDARD
    assert agent.requests("Put", "OK") == 1
    assert agent.requests("Get", "OK") == 1


async def test_a_64_mib_object_round_trips_in_1_mib_chunks(agent: Agent) -> None:
    data = os.urandom(64 * MiB)
    resp = await put(agent, STANDARD, "big.bin", data)
    assert resp.version.size == 64 * MiB
    first, body = await get(agent, STANDARD, "big.bin")
    assert first.header.digest == digest_of(data)
    assert body == data
    assert agent.sample("meridian_agent_bytes_stored", {}) == 64 * MiB
    assert agent.sample("meridian_agent_objects", {}) == 1


async def test_an_older_version_stays_readable_by_its_hlc(agent: Agent) -> None:
    old = await put(agent, STANDARD, "k", b"old")
    new = await put(agent, STANDARD, "k", b"new")
    assert new.version.hlc > old.version.hlc
    _, newest = await get(agent, STANDARD, "k")
    _, before = await get(agent, STANDARD, "k", version=old.version.hlc)
    assert (newest, before) == (b"new", b"old")


async def test_a_standard_put_commits_its_change_event_and_a_critical_one_its_epoch(
    agent: Agent,
) -> None:
    std = await put(agent, STANDARD, "a", b"x")
    crit = await put(agent, CRITICAL, "shard-0", b"y")
    events = agent.store.outbox_pending()
    assert [(e.dataset, e.key, str(e.version.hlc) if e.version else None) for e in events] == [
        (STANDARD, "a", std.version.hlc)
    ]
    assert events[0].policy_revision == 1
    # The owner's agent attached the epoch it read (spec/cli.md: no flag needed).
    [write] = agent.replication.writes
    assert write.dataset == CRITICAL
    assert write.admitted.epoch == 7
    assert write.version is not None and str(write.version.hlc) == crit.version.hlc


async def test_delete_writes_a_tombstone_that_hides_the_object(agent: Agent) -> None:
    await put(agent, STANDARD, "gone", b"bytes")
    resp = await agent.stub.Delete(
        agent_pb2.DeleteRequest(dataset=STANDARD, key="gone"), timeout=TIMEOUT_S
    )
    assert resp.version.op == types_pb2.OP_DELETE
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await get(agent, STANDARD, "gone")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    listed = await agent.stub.List(agent_pb2.ListRequest(dataset=STANDARD), timeout=TIMEOUT_S)
    assert list(listed.objects) == []
    with_deleted = await agent.stub.List(
        agent_pb2.ListRequest(dataset=STANDARD, include_deleted=True), timeout=TIMEOUT_S
    )
    assert [(o.key, o.version.op) for o in with_deleted.objects] == [("gone", types_pb2.OP_DELETE)]
    assert agent.sample("meridian_agent_objects", {}) == 0


async def test_deleting_what_is_not_stored_is_not_found(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Delete(
            agent_pb2.DeleteRequest(dataset=STANDARD, key="never"), timeout=TIMEOUT_S
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert agent.requests("Delete", "NOT_FOUND") == 1


async def test_list_pages_through_every_object_under_a_prefix(agent: Agent) -> None:
    keys = [f"shard-{i:03d}" for i in range(25)]
    for key in keys:
        await put(agent, STANDARD, key, key.encode())
    await put(agent, STANDARD, "other", b"not under the prefix")
    seen: list[str] = []
    token = ""
    pages = 0
    for _ in range(10):  # bounded: 3 pages expected
        page = await agent.stub.List(
            agent_pb2.ListRequest(
                dataset=STANDARD, prefix="shard-", page_size=10, page_token=token
            ),
            timeout=TIMEOUT_S,
        )
        pages += 1
        assert len(page.objects) <= 10
        seen.extend(o.key for o in page.objects)
        token = page.next_page_token
        if not token:
            break
    assert seen == keys
    assert pages == 3


async def test_list_refuses_a_page_larger_than_the_cap_naming_the_field(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.List(
            agent_pb2.ListRequest(dataset=STANDARD, page_size=10_001), timeout=TIMEOUT_S
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ListRequest.page_size" in (caught.value.details() or "")


async def test_health_says_live_region_agent_and_usage(agent: Agent) -> None:
    await put(agent, STANDARD, "a", b"12345")
    health = await agent.stub.Health(agent_pb2.HealthRequest(), timeout=TIMEOUT_S)
    assert health.live
    assert (health.region, health.agent_id) == (REGION, "agent-1")
    assert health.store.objects == 1
    assert health.store.bytes_stored == 5
    assert health.store.bytes_free > 0


async def test_concurrent_puts_of_one_key_leave_the_last_commit_newest(agent: Agent) -> None:
    bodies = [os.urandom(2 * MiB + i) for i in range(6)]
    responses = await asyncio.gather(*(put(agent, STANDARD, "hot", b) for b in bodies))
    hlcs = [r.version.hlc for r in responses]
    assert len(set(hlcs)) == len(bodies)
    newest = max(range(len(bodies)), key=lambda i: hlcs[i])
    first, body = await get(agent, STANDARD, "hot")
    assert first.header.hlc == hlcs[newest]
    assert body == bodies[newest]


async def test_a_set_commits_once_its_members_are_stored_and_reads_through_latest(
    agent: Agent,
) -> None:
    a = await put(agent, STANDARD, "ckpt/a", b"A1", set="step-1")
    b = await put(agent, STANDARD, "ckpt/b", b"B1", set="step-1")
    resp = await agent.stub.CommitSet(
        agent_pb2.CommitSetRequest(
            set=types_pb2.VersionSet(
                dataset=STANDARD,
                id="step-1",
                members=[
                    types_pb2.SetMember(key="ckpt/a", version=a.version.hlc),
                    types_pb2.SetMember(key="ckpt/b", version=b.version.hlc),
                ],
            )
        ),
        timeout=TIMEOUT_S,
    )
    assert resp.set.hlc
    await put(agent, STANDARD, "ckpt/a", b"A2")  # newer, outside the set
    _, in_set = await get(agent, STANDARD, "ckpt/a", set="latest")
    _, newest = await get(agent, STANDARD, "ckpt/a")
    assert (in_set, newest) == (b"A1", b"A2")
    for name in ("latest", "step-1"):
        shown = await agent.stub.GetSet(
            agent_pb2.GetSetRequest(dataset=STANDARD, set=name), timeout=TIMEOUT_S
        )
        assert shown.set == resp.set
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.GetSet(
            agent_pb2.GetSetRequest(dataset=STANDARD, set="step-9"), timeout=TIMEOUT_S
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.GetSet(agent_pb2.GetSetRequest(dataset=STANDARD), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_transfer_calls_are_unimplemented_without_transfers(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Fetch(agent_pb2.FetchRequest(dataset=STANDARD), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in agent.stub.Signature(
            agent_pb2.SignatureRequest(dataset=STANDARD, key="k"), timeout=TIMEOUT_S
        ):
            pass
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert agent.requests("Fetch", "UNIMPLEMENTED") == 1
    assert agent.requests("Signature", "UNIMPLEMENTED") == 1


async def test_a_put_whose_first_message_is_a_chunk_is_invalid(agent: Agent) -> None:
    async def chunk_first():  # type: ignore[no-untyped-def]
        yield agent_pb2.PutRequest(chunk=b"x")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(chunk_first(), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PutRequest.header" in (caught.value.details() or "")
    assert agent.files() == []


async def test_every_call_is_timed_by_call_answered_or_refused(agent: Agent) -> None:
    def timed(call: str) -> float:
        return agent.sample("meridian_agent_request_seconds_count", {"call": call})

    await put(agent, STANDARD, "timed", b"x" * 100)
    await get(agent, STANDARD, "timed")
    with pytest.raises(grpc.aio.AioRpcError):
        await agent.stub.Stat(
            agent_pb2.StatRequest(dataset=STANDARD, key="never/written"), timeout=TIMEOUT_S
        )
    assert (timed("Put"), timed("Get"), timed("Stat")) == (1, 1, 1)
    # Each took some time, and less than the test's own deadline.
    for call in ("Put", "Get", "Stat"):
        took = agent.sample("meridian_agent_request_seconds_sum", {"call": call})
        assert 0 < took < TIMEOUT_S, call


async def test_a_get_its_client_leaves_midway_is_counted_cancelled_not_ok(agent: Agent) -> None:
    await put(agent, STANDARD, "big", os.urandom(8 * MiB))
    call = agent.stub.Get(agent_pb2.GetRequest(dataset=STANDARD, key="big"), timeout=TIMEOUT_S)
    first = await call.read()
    assert first.WhichOneof("frame") == "header"
    assert (await call.read()).WhichOneof("frame") == "chunk"
    call.cancel()
    # The agent's side ends once grpc drops the handler's stream (its generator closed).
    await until(
        lambda: agent.requests("Get", "CANCELLED") == 1, timeout_s=10, what="Get counted cancelled"
    )
    assert agent.requests("Get", "OK") == 0
    assert agent.sample("meridian_agent_request_seconds_count", {"call": "Get"}) == 1
