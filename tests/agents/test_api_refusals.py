"""Every refusal of the agent API: its code, its message naming what was wrong, its
count, and nothing stored (no file under objects/ or tmp/, no row)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    REGIONS,
    STANDARD,
    TIMEOUT_S,
    US_ONLY,
    Agent,
    MiB,
    frames,
    header,
    put,
    refusal,
    world,
)
from blake3 import blake3
from fakes.admission import compiled
from harness.children import die_with_us
from waiting import WaitTimeoutError, until

from agents.errors import NotGovernedError, NotOwnerError, ResidencyError
from agents.rpc.status import from_rpc_error
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, StaleEpochError
from controlplane.errors import FencedError, UnavailableError
from meridian.v1 import agent_pb2


async def refused_counted(
    agent: Agent, dataset: str, key: str, data: bytes, **fields: object
) -> tuple[grpc.aio.AioRpcError, int]:
    return await refusal(lambda: put(agent, dataset, key, data, **fields))


async def refused(
    agent: Agent, dataset: str, key: str, data: bytes, **fields: object
) -> grpc.aio.AioRpcError:
    err, _ = await refused_counted(agent, dataset, key, data, **fields)
    return err


def assert_nothing_stored(agent: Agent, dataset: str) -> None:
    assert agent.files() == []
    assert agent.store.list_objects(dataset, include_deleted=True).items == []
    assert agent.store.outbox_pending() == []


@pytest.mark.parametrize(
    ("dataset", "key", "field"),
    [
        (STANDARD, "../x", "PutHeader.key"),
        (STANDARD, "a/../../x", "PutHeader.key"),
        (STANDARD, "/etc/passwd", "PutHeader.key"),
        (STANDARD, "nul\x00byte", "PutHeader.key"),
        (STANDARD, "", "PutHeader.key"),
        (STANDARD, "k" * 1025, "PutHeader.key"),
        ("../corpus", "k", "PutHeader.dataset"),
    ],
    ids=["dotdot", "inner-dotdot", "leading-slash", "nul", "empty", "too-long", "dataset"],
)
async def test_a_name_escaping_the_root_is_invalid_and_nothing_is_written(
    agent: Agent, dataset: str, key: str, field: str
) -> None:
    err, calls = await refused_counted(agent, dataset, key, b"payload")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith(field)
    assert agent.files() == []
    assert agent.requests("Put", "INVALID_ARGUMENT") == calls


async def test_get_of_an_escaping_name_is_invalid(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in agent.stub.Get(
            agent_pb2.GetRequest(dataset=STANDARD, key="../../etc/passwd"), timeout=TIMEOUT_S
        ):
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GetRequest.key" in (caught.value.details() or "")


async def test_a_copy_outside_the_residency_is_permission_denied_and_counted(agent: Agent) -> None:
    err = await refused(agent, US_ONLY, "doc", b"US only")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert isinstance(from_rpc_error(err), ResidencyError)
    assert "EU" in (err.details() or "") and "US" in (err.details() or "")
    assert (
        agent.sample(
            "meridian_residency_refused_total", {"dataset": US_ONLY, "direction": "receive"}
        )
        == 1
    )
    assert_nothing_stored(agent, US_ONLY)


async def test_an_ungoverned_dataset_is_unavailable_and_retriable(agent: Agent) -> None:
    err = await refused(agent, "nobody/governs", "k", b"x")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    again = from_rpc_error(err)
    assert isinstance(again, NotGovernedError) and again.retriable
    assert_nothing_stored(agent, "nobody/governs")


async def test_without_an_applied_policy_every_write_is_refused(agent: Agent) -> None:
    agent.policy.current = None
    err = await refused(agent, STANDARD, "k", b"x")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    again = from_rpc_error(err)
    assert isinstance(again, NotGovernedError) and again.retriable
    assert "no policy has been applied" in str(again)
    assert_nothing_stored(agent, STANDARD)


async def test_a_narrowed_residency_refuses_new_copies_at_once(agent: Agent) -> None:
    await put(agent, STANDARD, "before", b"x")
    narrowed = [p for p in world() if p.dataset != STANDARD]
    from agent_api_helpers import standard

    agent.policy.current = compiled(REGIONS, [*narrowed, standard(STANDARD, ("US",), "us-east")], 2)
    err = await refused(agent, STANDARD, "after", b"y")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert [s.key for s in agent.store.list_objects(STANDARD).items] == ["before"]


async def test_a_stale_epoch_is_failed_precondition_and_counted(agent: Agent) -> None:
    err = await refused(agent, CRITICAL, "shard", b"x", epoch=6)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    again = from_rpc_error(err)
    assert isinstance(again, StaleEpochError) and not again.retriable
    assert agent.sample("meridian_stale_epoch_refused_total", {"dataset": CRITICAL}) == 1
    assert_nothing_stored(agent, CRITICAL)


async def test_an_epoch_the_fence_has_seen_superseded_is_stale(agent: Agent) -> None:
    # A newer epoch learned by the fence (a replica push, a watch) wins over a cache.
    agent.fence.observe(CRITICAL, 9)
    err = await refused(agent, CRITICAL, "shard", b"x")
    assert isinstance(from_rpc_error(err), StaleEpochError)
    assert_nothing_stored(agent, CRITICAL)


async def test_an_epoch_newer_than_etcd_holds_is_refused(agent: Agent) -> None:
    err = await refused(agent, CRITICAL, "shard", b"x", epoch=8)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert type(from_rpc_error(err)) is FencedError
    assert_nothing_stored(agent, CRITICAL)


async def test_the_current_epoch_stated_is_accepted(agent: Agent) -> None:
    resp = await put(agent, CRITICAL, "shard", b"x", epoch=7)
    assert resp.version.size == 1
    assert agent.fence.highest_epoch(CRITICAL) == 7


async def test_a_dataset_handing_over_is_unavailable_and_retriable(agent: Agent) -> None:
    agent.owners.set(CRITICAL, "eu-west", 7, handing_over=True)
    err = await refused(agent, CRITICAL, "shard", b"x")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    again = from_rpc_error(err)
    assert isinstance(again, DatasetHandingOverError) and again.retriable
    assert agent.sample("meridian_handover_refused_total", {"dataset": CRITICAL}) == 1
    assert_nothing_stored(agent, CRITICAL)


async def test_a_region_that_does_not_own_a_critical_dataset_refuses_client_writes(
    agent: Agent,
) -> None:
    agent.owners.set(CRITICAL, "eu-central", 11)
    err = await refused(agent, CRITICAL, "shard", b"x", epoch=11)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert isinstance(from_rpc_error(err), NotOwnerError)
    assert "eu-central" in (err.details() or "")
    assert_nothing_stored(agent, CRITICAL)


async def test_a_critical_write_fails_closed_when_etcd_cannot_say(agent: Agent) -> None:
    agent.owners.unavailable = True
    err = await refused(agent, CRITICAL, "shard", b"x")
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert isinstance(from_rpc_error(err), UnavailableError)
    assert_nothing_stored(agent, CRITICAL)


async def test_a_critical_dataset_without_an_owner_is_refused(agent: Agent) -> None:
    agent.owners.records.clear()
    err = await refused(agent, CRITICAL, "shard", b"x")
    assert isinstance(from_rpc_error(err), NotGovernedError)
    assert_nothing_stored(agent, CRITICAL)


async def test_a_chunk_over_1_mib_is_resource_exhausted(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(
            frames(STANDARD, "k", [b"a" * 10, b"b" * (MiB + 1)]), timeout=TIMEOUT_S
        )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "PutRequest.chunk" in (caught.value.details() or "")
    assert_nothing_stored(agent, STANDARD)


async def test_a_message_over_the_servers_limit_is_resource_exhausted(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(frames(STANDARD, "k", [os.urandom(2 * MiB)]), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_nothing_stored(agent, STANDARD)


async def test_a_stream_past_its_stated_size_is_resource_exhausted(agent: Agent) -> None:
    err = await refused(agent, STANDARD, "k", os.urandom(3 * MiB), size=2 * MiB)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_nothing_stored(agent, STANDARD)


async def test_a_stream_short_of_its_stated_size_is_invalid(agent: Agent) -> None:
    err = await refused(agent, STANDARD, "k", b"abc", size=4)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_nothing_stored(agent, STANDARD)


async def test_a_stated_digest_the_bytes_do_not_match_is_data_loss(agent: Agent) -> None:
    wrong = "blake3:" + blake3(b"other bytes").hexdigest()
    err, calls = await refused_counted(agent, STANDARD, "k", os.urandom(MiB + 5), digest=wrong)
    assert err.code() == grpc.StatusCode.DATA_LOSS
    assert agent.requests("Put", "DATA_LOSS") == calls
    assert_nothing_stored(agent, STANDARD)


async def test_the_right_stated_size_and_digest_are_accepted(agent: Agent) -> None:
    data = os.urandom(MiB + 5)
    resp = await put(
        agent, STANDARD, "k", data, size=len(data), digest="blake3:" + blake3(data).hexdigest()
    )
    assert resp.version.size == len(data)


async def test_a_malformed_stated_digest_is_invalid_naming_the_field(agent: Agent) -> None:
    err = await refused(agent, STANDARD, "k", b"x", digest="md5:abc")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("PutHeader.digest")
    assert_nothing_stored(agent, STANDARD)


async def test_an_object_over_the_agents_cap_is_resource_exhausted(tmp_path: object) -> None:
    from pathlib import Path

    from agent_api_helpers import start_agent, stop_agent

    agent = await start_agent(Path(str(tmp_path)) / "capped", max_object_bytes=2 * MiB)
    try:
        err = await refused(agent, STANDARD, "k", os.urandom(3 * MiB))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        err = await refused(agent, STANDARD, "k", b"x", size=3 * MiB)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_nothing_stored(agent, STANDARD)
    finally:
        await stop_agent(agent)


async def test_a_put_past_its_deadline_is_abandoned_and_leaves_nothing(agent: Agent) -> None:
    release = asyncio.Event()

    async def stalled() -> AsyncIterator[agent_pb2.PutRequest]:
        yield header(STANDARD, "slow")
        yield agent_pb2.PutRequest(chunk=os.urandom(MiB))
        await release.wait()

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(stalled(), timeout=0.5)
    release.set()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server sees a cancel, or (as for a killed writer) a stream ending without
    # its end frame, depending on which reaches it first; either way it stores nothing.
    ends = ("DEADLINE_EXCEEDED", "CANCELLED", "INVALID_ARGUMENT")
    with contextlib.suppress(WaitTimeoutError):  # the assertions say what it saw
        # The server's end lands after the client's deadline.
        await until(
            lambda: sum(agent.requests("Put", c) for c in ends) >= 1,
            10,
            "the server to end the call",
            step_s=0.02,
        )
    assert sum(agent.requests("Put", c) for c in ends) == 1
    assert agent.requests("Put", "OK") == 0
    assert_nothing_stored(agent, STANDARD)


async def test_a_handover_during_a_long_upload_refuses_it_before_its_commit(
    agent: Agent,
) -> None:
    admitted = asyncio.Event()
    release = asyncio.Event()

    async def upload() -> AsyncIterator[agent_pb2.PutRequest]:
        yield header(CRITICAL, "shard")
        yield agent_pb2.PutRequest(chunk=os.urandom(MiB))
        await release.wait()
        yield agent_pb2.PutRequest(chunk=os.urandom(MiB))
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    call = asyncio.ensure_future(agent.stub.Put(upload(), timeout=TIMEOUT_S))
    with contextlib.suppress(WaitTimeoutError):  # the assertion says how many it read
        await until(
            lambda: agent.owners.reads >= 1, 10, "the server to admit the header", step_s=0.02
        )
    assert agent.owners.reads == 1
    admitted.set()
    agent.owners.set(CRITICAL, "eu-west", 7, handing_over=True)
    release.set()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert isinstance(from_rpc_error(caught.value), DatasetHandingOverError)
    assert_nothing_stored(agent, CRITICAL)


async def test_a_stream_without_its_end_stores_nothing(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(frames(STANDARD, "k", [b"half of it"], end=False), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("PutRequest.end")
    assert_nothing_stored(agent, STANDARD)


async def test_a_stated_size_fully_received_needs_no_end(agent: Agent) -> None:
    resp = await agent.stub.Put(
        frames(STANDARD, "k", [b"12345"], end=False, size=5), timeout=TIMEOUT_S
    )
    assert resp.version.size == 5


async def test_a_message_after_the_end_is_invalid(agent: Agent) -> None:
    async def after_end() -> AsyncIterator[agent_pb2.PutRequest]:
        async for frame in frames(STANDARD, "k", [b"abc"]):
            yield frame
        yield agent_pb2.PutRequest(chunk=b"more")

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(after_end(), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_nothing_stored(agent, STANDARD)


async def test_a_digest_stated_at_the_end_is_checked(agent: Agent) -> None:
    data = os.urandom(MiB + 1)

    async def ending_with(digest: str) -> AsyncIterator[agent_pb2.PutRequest]:
        async for frame in frames(STANDARD, "k", [data[:MiB], data[MiB:]], end=False):
            yield frame
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd(digest=digest))

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Put(ending_with("blake3:" + blake3(b"no").hexdigest()), timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    assert_nothing_stored(agent, STANDARD)
    resp = await agent.stub.Put(
        ending_with("blake3:" + blake3(data).hexdigest()), timeout=TIMEOUT_S
    )
    assert resp.version.size == len(data)


KILLED_WRITER = r"""
import asyncio, sys
import grpc
from meridian.v1 import agent_pb2, agent_pb2_grpc

async def main() -> None:
    channel = grpc.aio.insecure_channel(sys.argv[1])
    stub = agent_pb2_grpc.AgentStub(channel)

    async def frames():
        yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=sys.argv[2], key="torn"))
        # More than the servicer holds in memory (INLINE_BYTES): staged in a file.
        yield agent_pb2.PutRequest(chunk=b"x" * 100_000)
        print("sent", flush=True)
        await asyncio.sleep(60)  # a writer that hangs mid-stream: killed long before

    await stub.Put(frames(), timeout=60)

asyncio.run(main())
"""


async def test_a_writer_killed_mid_stream_leaves_nothing_stored(agent: Agent) -> None:
    # grpc hands the server a clean end of stream when the writer dies, then cancels
    # the call a moment later: the cancel usually wins the race against the commit
    # here, but not always (seen with an oversize message); the missing end frame is
    # what refuses it for sure (test_a_stream_without_its_end_stores_nothing).
    proc = await _killed_writer(agent)
    # Kill it once the server holds the chunk and waits for more.
    part = agent.root / "tmp"
    with contextlib.suppress(WaitTimeoutError):  # the assertion below fails instead
        await until(
            lambda: any(f.stat().st_size == 100_000 for f in part.glob("*.part")),
            10,
            "the chunk to be held",
            step_s=0.02,
        )
    assert any(f.stat().st_size == 100_000 for f in part.glob("*.part"))
    proc.kill()
    await proc.wait()
    with contextlib.suppress(WaitTimeoutError):  # the assertions say what it saw
        await until(
            lambda: (
                sum(agent.requests("Put", c) for c in ("INVALID_ARGUMENT", "CANCELLED", "OK")) >= 1
            ),
            10,
            "the server to end the call",
            step_s=0.02,
        )
    assert agent.requests("Put", "OK") == 0
    # One refused call, or more where a writer died on its own before it could say so.
    assert agent.requests("Put", "INVALID_ARGUMENT") + agent.requests("Put", "CANCELLED") >= 1
    assert_nothing_stored(agent, STANDARD)


async def _killed_writer(agent: Agent, attempts: int = 3) -> asyncio.subprocess.Process:
    """The writer of KILLED_WRITER once it says it sent its chunk. A fork of this
    gRPC-using process has been seen to die before its exec (once in a loaded full run:
    "Epoll1Poller encountered epoll_wait error: Bad file descriptor", no traceback; gRPC's
    poller restarted in the forked child meets the epoll fd that Popen's close_fds
    closed, grpc/grpc#43055): not the agent's doing, so such a writer is replaced
    (bounded), and each one's exit and stderr are shown if all of them die."""
    died: list[str] = []
    for _ in range(attempts):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            KILLED_WRITER,
            f"127.0.0.1:{agent.port}",
            STANDARD,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_us(),  # forked by this (the loop's) thread, which outlives it
        )
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), TIMEOUT_S)
        if line.strip() == b"sent":
            return proc
        _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
        died.append(f"exit {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    raise AssertionError(f"every writer died before it sent its chunk: {died}")
