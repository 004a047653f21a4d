"""A call cancelled while a thread opens or stages for it (its deadline passing while
the store's lock is held by a group commit, say) leaves nothing open or behind: the
reader is closed, the staged file removed, once the thread hands them over."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from agent_api_helpers import STANDARD, Agent
from waiting import until

from agents.client import AgentClient
from agents.service.servicer import INLINE_BYTES
from agents.store import ObjectReader, StagedWrite, files
from agents.store.staging import TMP
from meridian.v1 import agent_pb2

SLOW_S = 0.5  # how long the thread takes; the calls' deadlines are a fifth of it


def slowed(fn: Callable[..., Any], handed: list[Any]) -> Callable[..., Any]:
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_S)
        out = fn(*args, **kwargs)
        handed.append(out)
        return out

    return slow


async def test_a_get_cancelled_while_its_reader_opens_closes_the_reader(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AgentClient(f"127.0.0.1:{agent.port}") as client:
        await client.put(STANDARD, "k", os.urandom(INLINE_BYTES + 1))
    handed: list[ObjectReader] = []
    monkeypatch.setattr(agent.store, "open", slowed(agent.store.open, handed))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in agent.stub.Get(
            agent_pb2.GetRequest(dataset=STANDARD, key="k"), timeout=SLOW_S / 5
        ):
            pass
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def closed() -> bool:
        return len(handed) == 1 and handed[0]._fd is None

    await until(closed, 10, what="the reader opened for the cancelled Get to be closed")


async def test_a_put_cancelled_while_it_stages_leaves_no_file(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[StagedWrite] = []
    monkeypatch.setattr(agent.service, "_stage", slowed(agent.service._stage, handed))
    data = os.urandom(INLINE_BYTES + 1)  # past what is held inline: staged in a file
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await agent.stub.Put(
            iter(
                [
                    agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=STANDARD, key="k")),
                    agent_pb2.PutRequest(chunk=data),
                    agent_pb2.PutRequest(end=agent_pb2.PutEnd()),
                ]
            ),
            timeout=SLOW_S / 5,
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def tmp_files() -> list[str]:
        return sorted(p.name for p in (agent.root / TMP).iterdir())

    async def dropped() -> bool:
        return len(handed) == 1 and handed[0]._fd is None and not tmp_files()

    await until(dropped, 10, what="the staged file of the cancelled Put to go", detail=tmp_files)
    assert agent.store.list_objects(STANDARD).items == []


async def test_a_put_cancelled_during_its_fsync_does_not_hold_the_event_loop(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The staged file's fsync holds its write lock; the cancelled call's abort waits
    # for that lock, in a thread: the loop (every other call of the agent) goes on.
    real = files.fsync_file
    syncing = threading.Event()

    def slow_fsync(fd: int) -> None:
        syncing.set()
        time.sleep(2.0)
        real(fd)

    monkeypatch.setattr(files, "fsync_file", slow_fsync)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    data = os.urandom(INLINE_BYTES + 1)
    with pytest.raises(grpc.aio.AioRpcError):
        await agent.stub.Put(
            iter(
                [
                    agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=STANDARD, key="k")),
                    agent_pb2.PutRequest(chunk=data),
                    agent_pb2.PutRequest(end=agent_pb2.PutEnd()),
                ]
            ),
            timeout=0.3,
        )
    assert syncing.is_set()  # the deadline fell during the fsync

    async def dropped() -> bool:
        return not any((agent.root / TMP).iterdir())

    await until(dropped, 10, what="the cancelled Put's file to go")
    stop.set()
    await ticking
    # Without the thread, one gap is the rest of the fsync (about 1.7 s).
    assert max(gaps) < 1.0, sorted(gaps)[-3:]
