"""The server's graceful stop, a commit refused past the deadline, and critical deletes
and sets handed to the replication seam."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_api_helpers import (
    CRITICAL,
    STANDARD,
    TIMEOUT_S,
    Agent,
    MiB,
    header,
    put,
    start_agent,
    stop_agent,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from waiting import until

from agents.service import stop_server
from meridian.v1 import agent_pb2, types_pb2


class AbortedError(Exception):
    pass


class PastDeadline:
    """Test scaffolding: a servicer context whose deadline has already passed."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float:
        return 0.0

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, details)
        raise AbortedError(details)


async def test_a_write_whose_deadline_passed_before_its_commit_stores_nothing(
    agent: Agent,
) -> None:
    await put(agent, STANDARD, "k", b"x")
    context = PastDeadline()
    with pytest.raises(AbortedError):
        await agent.service.Delete(
            agent_pb2.DeleteRequest(dataset=STANDARD, key="k"),
            context,  # type: ignore[arg-type]
        )
    assert context.aborted is not None
    assert context.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "nothing was stored" in context.aborted[1]
    assert agent.store.stat(STANDARD, "k").version.op == "put"  # no tombstone written
    assert agent.requests("Delete", "DEADLINE_EXCEEDED") == 1


async def test_stop_lets_a_call_in_flight_finish_and_abandons_one_past_the_grace(
    tmp_path: Path,
) -> None:
    agent = await start_agent(tmp_path / "root")
    release = asyncio.Event()
    started = asyncio.Event()
    stop_begun = asyncio.Event()

    async def quick() -> AsyncIterator[agent_pb2.PutRequest]:
        yield header(STANDARD, "quick")
        started.set()
        await stop_begun.wait()  # still streaming when the stop begins
        yield agent_pb2.PutRequest(chunk=b"done in time")
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    async def stuck() -> AsyncIterator[agent_pb2.PutRequest]:
        yield header(STANDARD, "stuck")
        yield agent_pb2.PutRequest(chunk=os.urandom(MiB))
        await release.wait()

    try:
        finishing = asyncio.ensure_future(agent.stub.Put(quick(), timeout=TIMEOUT_S))
        abandoned = asyncio.ensure_future(agent.stub.Put(stuck(), timeout=TIMEOUT_S))
        await asyncio.wait_for(started.wait(), TIMEOUT_S)
        # The stop has begun once the health service says NOT_SERVING (stop_server
        # turns it before it stops the server); only then does `quick` go on.
        watch = health_pb2_grpc.HealthStub(agent.channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.ensure_future(stop_server(agent.server, 2.0))
        turned = await asyncio.wait_for(watch.read(), TIMEOUT_S)
        assert turned.status == health_pb2.HealthCheckResponse.NOT_SERVING
        stop_begun.set()
        await stopping
        release.set()
        done = await finishing
        assert done.version.size == len(b"done in time")
        with pytest.raises(grpc.aio.AioRpcError):
            await abandoned
        assert [s.key for s in agent.store.list_objects(STANDARD).items] == ["quick"]

        def staged() -> list[str]:
            return [f for f in agent.files() if Path(f).parent == agent.root / "tmp"]

        # The abandoned Put's staging is aborted in a thread of its own (it waits for the
        # write lock an fsync holds), which may end just after the client saw the error.
        await until(lambda: not staged(), TIMEOUT_S, what="the abandoned Put's staging to go")
    finally:
        release.set()
        await stop_agent(agent)


async def test_critical_deletes_and_sets_reach_the_replication_seam(agent: Agent) -> None:
    a = await put(agent, CRITICAL, "step-1/a", b"A", set="step-1")
    resp = await agent.stub.CommitSet(
        agent_pb2.CommitSetRequest(
            set=types_pb2.VersionSet(
                dataset=CRITICAL,
                id="step-1",
                members=[types_pb2.SetMember(key="step-1/a", version=a.version.hlc)],
            )
        ),
        timeout=TIMEOUT_S,
    )
    await agent.stub.Delete(
        agent_pb2.DeleteRequest(dataset=CRITICAL, key="step-1/a", epoch=7), timeout=TIMEOUT_S
    )
    kinds = [
        ("set" if w.set_record else w.version.op if w.version else "?", w.admitted.epoch)
        for w in agent.replication.writes
    ]
    assert kinds == [("put", 7), ("set", 7), ("delete", 7)]
    assert agent.replication.writes[1].set_record is not None
    assert str(agent.replication.writes[1].set_record.hlc) == resp.set.hlc
    assert agent.store.outbox_pending() == []  # critical writes do not go through Kafka


async def test_a_critical_delete_at_a_stale_epoch_writes_no_tombstone(agent: Agent) -> None:
    await put(agent, CRITICAL, "k", b"x")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.Delete(
            agent_pb2.DeleteRequest(dataset=CRITICAL, key="k", epoch=3), timeout=TIMEOUT_S
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert agent.store.stat(CRITICAL, "k").version.op == "put"


async def test_a_set_naming_a_member_not_stored_is_not_found(agent: Agent) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await agent.stub.CommitSet(
            agent_pb2.CommitSetRequest(
                set=types_pb2.VersionSet(
                    dataset=STANDARD,
                    id="s",
                    members=[
                        types_pb2.SetMember(key="missing", version="1764579123456.00000@eu-west")
                    ],
                )
            ),
            timeout=TIMEOUT_S,
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert agent.store.list_sets(STANDARD) == []
