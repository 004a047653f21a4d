"""A replicator stops (SIGTERM) and gives partitions up (a rebalance) within its drain
bound while Kafka does not answer its commit: the Kafka client retries a commit for as
long as Kafka is away. What is left uncommitted is replayed by the next owner."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import repl_builders as b
from repl_rig import RigFactory
from structlog.testing import capture_logs

from controlplane.domain.events import ChangeEvent
from controlplane.ports.changelog import Record
from replicator import applier as applier_module
from replicator.ports import Source


async def test_a_stop_ends_within_its_bound_while_the_commit_hangs(
    rig_factory: RigFactory,
) -> None:
    rig = rig_factory(drain_timeout_s=0.3)
    rig.publish(b.put("a"))
    hanging = asyncio.Event()

    async def never(records: Sequence[Record]) -> None:
        hanging.set()
        await asyncio.Event().wait()  # Kafka away: the client retries for ever

    rig.log.commit = never  # type: ignore[method-assign]
    loop = rig.loop()
    with capture_logs() as logs:
        await loop.start()
        await loop.wait_handled(1, 10)
        await asyncio.wait_for(loop.stop(), 5)
    assert hanging.is_set()
    assert [e["at"] for e in logs if e["event"] == "commit_timeout"] == ["stop"]
    assert rig.agent.held  # applied; its offset is replayed by the next owner


async def test_a_revoke_ends_within_its_bound_while_the_commit_hangs(
    rig_factory: RigFactory,
) -> None:
    rig = rig_factory(drain_timeout_s=0.3)
    rig.publish(b.put("a"))

    async def never(records: Sequence[Record]) -> None:
        await asyncio.Event().wait()

    rig.log.commit = never  # type: ignore[method-assign]
    loop = rig.loop()
    await loop.start()
    try:
        await loop.wait_handled(1, 10)
        with capture_logs() as logs:
            await asyncio.wait_for(loop.on_revoked({(rig.log.topic, p) for p in range(4)}), 5)
        assert [e["at"] for e in logs if e["event"] == "commit_timeout"] == ["revoke"]
    finally:
        await asyncio.wait_for(loop.stop(), 5)


async def test_a_catalog_that_does_not_answer_does_not_slow_the_fetches(
    rig_factory: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other holders of an object are asked of the catalog; one away must cost a
    # fetch a bounded wait once, then nothing for a while (the origin is asked anyway).
    monkeypatch.setattr(applier_module, "HOLDERS_WAIT_S", 0.1)
    rig = rig_factory()
    asked: list[str] = []

    class HangingCatalog:
        async def holders(self, event: ChangeEvent) -> list[Source]:
            asked.append(event.key)
            await asyncio.Event().wait()  # a catalog blackholed
            return []

    rig.applier._holders = HangingCatalog()  # type: ignore[assignment]
    first = b.put("a", inline=False)
    assert await asyncio.wait_for(rig.applier.handle_many([b.rec_of(first)]), 5) == ["applied"]
    later = [b.rec_of(b.put(k, inline=False), n) for n, k in enumerate(("b", "c"), 1)]
    assert await asyncio.wait_for(rig.applier.handle_many(later), 5) == ["applied"] * 2
    assert asked == ["a"]  # not asked again while it is skipped
