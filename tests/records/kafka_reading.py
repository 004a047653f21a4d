"""Reading `meridian.changes` back in the records tests: every record of one dataset,
from the start of the topic, in a fresh consumer group (bounded in time)."""

from __future__ import annotations

import time
import uuid

from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaConsumer
from controlplane.ports.changelog import Record


async def records_of(
    bootstrap: str, dataset: str, *, at_least: int, timeout_s: float = 60.0
) -> list[Record]:
    """The records whose key is `dataset/...`: polls until `at_least` arrived and a poll
    then comes back empty (so duplicates written after them are seen too)."""
    prefix = f"{dataset}/".encode()
    consumer = KafkaConsumer(
        bootstrap, topics=[CHANGES_TOPIC.name], group_id=f"records-test-{uuid.uuid4().hex[:8]}"
    )
    found: list[Record] = []
    deadline = time.monotonic() + timeout_s
    async with consumer:
        while time.monotonic() < deadline:
            batch = await consumer.poll(max_records=1000, timeout_ms=1000)
            found += [r for r in batch if r.key is not None and r.key.startswith(prefix)]
            if not batch and len(found) >= at_least:
                return found
    raise AssertionError(
        f"read {len(found)} records of {dataset} in {timeout_s} s, expected {at_least}"
    )
