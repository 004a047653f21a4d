"""Child process of the outbox crash tests: drain a store's outbox to Kafka and SIGKILL
itself at one step of the second batch (test scaffolding, run as a script).

    python outbox_child.py ROOT BOOTSTRAP STEP

Steps: `mid-send` (half of the batch acknowledged by the broker, the rest not sent),
`after-ack` (the whole batch acknowledged, before the outbox is told), `after-mark`
(right after the outbox forgot the batch). Exits 3 if it was never killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings
from agents.store import ObjectStore
from controlplane.adapters.kafka import KafkaProducer
from controlplane.domain.hlc import HybridClock
from controlplane.ports.changelog import Delivery

BATCH = 5


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DyingProducer:
    def __init__(self, real: KafkaProducer, step: str) -> None:
        self.real, self.step, self.batches = real, step, 0

    async def send_many(self, topic: str, items: Sequence[tuple[bytes, bytes]]) -> list[Delivery]:
        self.batches += 1
        if self.batches == 2 and self.step == "mid-send":
            await self.real.send_many(topic, items[: len(items) // 2])
            die()
        done = await self.real.send_many(topic, items)
        if self.batches == 2 and self.step == "after-ack":
            die()
        return done


async def main(root: str, bootstrap: str, step: str) -> None:
    store = ObjectStore(root, clock=HybridClock("eu-west"))
    real_published = store.outbox_published
    marks = 0

    def published(event_ids: object) -> None:
        nonlocal marks
        real_published(event_ids)  # type: ignore[arg-type]
        marks += 1
        if marks == 2 and step == "after-mark":
            die()

    store.outbox_published = published  # type: ignore[method-assign]
    settings = OutboxSettings(origin_agent="127.0.0.1:7001", batch_size=BATCH)
    async with KafkaProducer(bootstrap, request_timeout_ms=10_000) as real:
        drain = OutboxDrain(
            store, DyingProducer(real, step), AgentMetrics("eu-west"), "eu-west", settings
        )
        async with drain:
            await asyncio.sleep(60)  # killed long before
    sys.exit(3)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
