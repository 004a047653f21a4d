"""MembershipWatch over a fake coordination port: joins, leaves, lease lapses."""

from __future__ import annotations

import asyncio
import json

import waiting
from fakes.coordination import MemoryCoordination

from agents.placement import MembershipWatch
from controlplane.coordination.protocols import keys
from controlplane.errors import UnavailableError


def registration(agent_id: str, weight: int = 1, state: str = "serving") -> bytes:
    doc = {"id": agent_id, "endpoint": f"h:{agent_id}", "weight": weight, "state": state}
    return json.dumps(doc).encode()


async def until(watch: MembershipWatch, serving: list[str]) -> None:
    async with asyncio.timeout(5):
        while [m.agent_id for m in watch.current.serving] != serving:
            await watch.changed()


async def test_watch_follows_registrations() -> None:
    coord = MemoryCoordination()
    await coord.put(keys.agent("eu-west", "a"), registration("a"))
    await coord.put(keys.agent("us-east", "z"), registration("z"))  # another region
    watch = MembershipWatch(coord, "eu-west", retry_initial_s=0.01)
    async with watch:
        assert [m.agent_id for m in watch.current.serving] == ["a"]
        assert watch.current.r == 1
        lease = await coord.grant(1)
        await coord.put(keys.agent("eu-west", "b"), registration("b", 2), lease=lease.id)
        await until(watch, ["a", "b"])
        assert watch.current.r == 2
        member = watch.current.get("b")
        assert member is not None and member.weight == 2
        await coord.put(keys.agent("eu-west", "b"), registration("b", 2, "leaving"), lease=lease.id)
        await until(watch, ["a"])
        assert watch.current.get("b") is not None  # still listed: it serves reads
        await coord.revoke(lease.id)
        async with asyncio.timeout(5):
            while watch.current.get("b") is not None:
                await watch.changed()


async def test_watch_reads_again_after_its_watch_fails() -> None:
    coord = MemoryCoordination()
    watch = MembershipWatch(coord, "eu-west", retry_initial_s=0.01, retry_max_s=0.05)
    async with watch:
        coord.set_unavailable(True)
        coord.break_watches(UnavailableError("the watch failed (test)"))
        # The watch ended and its re-read is refused too: it is retrying.
        await waiting.until(lambda: coord.refused >= 2, 5, "the watch to meet the outage")
        coord.set_unavailable(False)
        await coord.put(keys.agent("eu-west", "c"), registration("c"))
        await until(watch, ["c"])
