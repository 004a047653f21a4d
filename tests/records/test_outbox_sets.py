"""The outbox drain publishes a version set committed here (real Kafka): the set's event
(schema 2, keyed `dataset NUL set/id`) decodes to the set as committed, counts as
pending until acknowledged, follows its members in commit order, and a batch the
producer fails after writing it is sent again as the same event (same event_id)."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import AsyncIterator, Sequence

import pytest
from records_helpers import REGION
from waiting import until

from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings
from agents.store import ObjectStore
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaConsumer, KafkaProducer
from controlplane.domain.events import ChangeEvent, SetEvent, set_log_key
from controlplane.errors import UnavailableError
from controlplane.ports.changelog import Delivery, Record
from meridian.convert import decode_log_event

pytestmark = pytest.mark.integration

AGENT = "127.0.0.1:7001"


class FailsOnceAfterWriting:
    """The real producer; the batch holding the set is written, then reported failed
    once (as when the broker's acknowledgement is lost): the drain must send it again."""

    def __init__(self, real: KafkaProducer, marker: bytes) -> None:
        self.real, self.marker, self.failed = real, marker, False

    async def send_many(self, topic: str, items: Sequence[tuple[bytes, bytes]]) -> list[Delivery]:
        done = await self.real.send_many(topic, items)
        if not self.failed and any(key == self.marker for key, _ in items):
            self.failed = True
            raise UnavailableError("the acknowledgement was lost (test)")
        return done


@pytest.fixture
async def producer(kafka_bootstrap: str) -> AsyncIterator[KafkaProducer]:
    async with KafkaProducer(kafka_bootstrap, request_timeout_ms=10_000) as p:
        yield p


async def records_of(bootstrap: str, keys: set[bytes], at_least: int) -> list[Record]:
    """Records of `meridian.changes` with one of `keys`, from the start (fresh group),
    until `at_least` arrived and a poll comes back empty; bounded in time."""
    consumer = KafkaConsumer(
        bootstrap, topics=[CHANGES_TOPIC.name], group_id=f"sets-test-{uuid.uuid4().hex[:8]}"
    )
    found: list[Record] = []
    deadline = time.monotonic() + 60
    async with consumer:
        while time.monotonic() < deadline:
            batch = await consumer.poll(max_records=1000, timeout_ms=1000)
            found += [r for r in batch if r.key in keys]
            if not batch and len(found) >= at_least:
                return found
    raise AssertionError(f"read {len(found)} records in 60 s, expected {at_least}")


def _pending(metrics: AgentMetrics) -> float:
    return metrics.registry.get_sample_value("meridian_outbox_pending") or 0.0


async def test_a_committed_set_is_published_after_its_members_as_the_same_event(
    store: ObjectStore, metrics: AgentMetrics, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    ds = f"corpus/outbox-sets-{uuid.uuid4().hex[:8]}"
    versions = {
        f"shard-{i}": store.put(ds, f"shard-{i}", [b"shard %d" % i], outbox=True, policy_revision=4)
        for i in range(3)
    }
    committed = store.commit_set(
        ds, "step-1", {k: v.hlc for k, v in versions.items()}, outbox=True, policy_revision=4
    )
    queued = store.outbox_pending(limit=100)
    # Commit order, which the drain keeps: every member's event before the set's.
    assert [e.kind for e in queued] == ["version"] * 3 + ["set"]
    row = queued[-1]
    key = set_log_key(ds, "step-1").encode()
    drain_producer = FailsOnceAfterWriting(producer, key)
    settings = OutboxSettings(origin_agent=AGENT, batch_size=2, retry_initial_s=0.05)
    drain = OutboxDrain(store, drain_producer, metrics, REGION, settings)
    assert _pending(metrics) == 4  # the set's event counts

    async with drain:
        await until(lambda: _pending(metrics) == 0, 30, "the outbox to drain")
    assert drain_producer.failed and store.outbox_count() == 0

    keys = {f"{ds}/{k}".encode() for k in versions} | {key}
    records = await records_of(kafka_bootstrap, keys, at_least=6)  # all of them, resends too
    copies = collections.Counter(r.key for r in records)
    # The set rode in the second batch (with shard-2), which went twice: same events.
    assert copies == {key: 2, f"{ds}/shard-2".encode(): 2} | {
        f"{ds}/shard-{i}".encode(): 1 for i in (0, 1)
    }
    sets = [decode_log_event(r.value) for r in records if r.key == key]
    assert sets[0] == sets[1]
    event = sets[0]
    assert isinstance(event, SetEvent)
    assert event.event_id == row.event_id and event.policy_revision == 4
    assert event.origin_region == REGION and event.epoch == 0
    assert event.version_set == committed.as_version_set()
    changes = [decode_log_event(r.value) for r in records if r.key != key]
    assert all(isinstance(c, ChangeEvent) for c in changes)
    assert {c.key: c.version for c in changes if isinstance(c, ChangeEvent)} == versions
