"""A complete listing of a critical dataset (a new owner's takeover pass) waits for the
pushed copies already past their owner read (agents/admission.py, *A new owner's
listing*); a partial one (a catch-up's) does not."""

from __future__ import annotations

import asyncio

from agent_api_helpers import CRITICAL, TIMEOUT_S, Agent

from meridian.v1 import agent_pb2


async def test_a_complete_listing_waits_for_a_copy_past_its_owner_read(agent: Agent) -> None:
    admission = agent.service.admission
    release, registered = asyncio.Event(), asyncio.Event()

    async def in_flight() -> None:
        with admission.receiving([CRITICAL]):
            registered.set()
            await release.wait()  # read etcd, committing

    copy = asyncio.create_task(in_flight())
    await asyncio.wait_for(registered.wait(), 5)
    complete = asyncio.ensure_future(
        agent.stub.List(
            agent_pb2.ListRequest(dataset=CRITICAL, include_deleted=True, complete=True),
            timeout=TIMEOUT_S,
        )
    )
    partial = await agent.stub.List(agent_pb2.ListRequest(dataset=CRITICAL), timeout=TIMEOUT_S)
    assert list(partial.objects) == []  # answered while the copy is in flight
    await asyncio.sleep(0.1)  # the window: the complete listing must still wait
    assert not complete.done()
    release.set()
    await asyncio.wait_for(complete, TIMEOUT_S)
    await copy


async def test_a_later_page_of_a_complete_listing_waits_too(agent: Agent) -> None:
    """A region's listing pages by key: an agent that joined the region after the first
    page is first asked for a later one, and must settle there."""
    admission = agent.service.admission
    release, registered = asyncio.Event(), asyncio.Event()

    async def in_flight() -> None:
        with admission.receiving([CRITICAL]):
            registered.set()
            await release.wait()

    copy = asyncio.create_task(in_flight())
    await asyncio.wait_for(registered.wait(), 5)
    later = asyncio.ensure_future(
        agent.stub.List(
            agent_pb2.ListRequest(dataset=CRITICAL, complete=True, page_token="shard-0499"),
            timeout=TIMEOUT_S,
        )
    )
    await asyncio.sleep(0.1)  # the window: the later page must still wait
    assert not later.done()
    release.set()
    await asyncio.wait_for(later, TIMEOUT_S)
    await copy


async def test_a_complete_listing_waits_for_this_agents_own_writes_being_pushed(
    agent: Agent,
) -> None:
    """In a region of several agents, another agent's takeover proof lists this one: a
    write of ours already pushed (a replica may hold it) but not yet committed here
    would read as lone and be rewound. The listing waits for it (local_commits)."""
    admission = agent.service.admission
    asked, release = asyncio.Event(), asyncio.Event()

    async def local_commits(dataset: str) -> None:
        assert dataset == CRITICAL
        asked.set()
        await release.wait()

    admission.local_commits = local_commits
    complete = asyncio.ensure_future(
        agent.stub.List(agent_pb2.ListRequest(dataset=CRITICAL, complete=True), timeout=TIMEOUT_S)
    )
    await asyncio.wait_for(asked.wait(), 5)
    partial = await agent.stub.List(agent_pb2.ListRequest(dataset=CRITICAL), timeout=TIMEOUT_S)
    assert list(partial.objects) == []  # a catch-up's partial listing does not wait
    assert not complete.done()
    release.set()
    await asyncio.wait_for(complete, TIMEOUT_S)
