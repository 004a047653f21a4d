"""The change log on a real Kafka broker: idempotent, ordered per key, resumable."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import pytest

from controlplane.adapters.kafka import KafkaAdmin, KafkaConsumer, KafkaProducer
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.errors import NotFoundError
from controlplane.ports.changelog import Record, TopicSpec
from controlplane.settings import Settings
from controlplane.stack.kafka import wan_proxy_port
from controlplane.stack.manager import KAFKA_WAN_PROXY

pytestmark = pytest.mark.integration

MESSAGES = 10_000
KEYS = 97


async def _consume(
    bootstrap: str, topic: str, group: str, *, stop_after: int, deadline_s: float
) -> list[Record]:
    """Process records batch by batch, committing each batch only after it is processed."""
    processed: list[Record] = []
    async with KafkaConsumer(bootstrap, topics=[topic], group_id=group) as consumer:
        deadline = time.monotonic() + deadline_s
        while len(processed) < stop_after and time.monotonic() < deadline:
            batch = await consumer.poll(max_records=500, timeout_ms=500)
            processed.extend(batch)
            await consumer.commit(batch)
    return processed


async def test_ten_thousand_keyed_messages_exactly_once_across_restart(
    kafka_bootstrap: str,
) -> None:
    topic = f"test.changes.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(kafka_bootstrap) as admin:
        assert await admin.ensure_topics([TopicSpec(topic, partitions=6)]) == [topic]
        assert await admin.ensure_topics([TopicSpec(topic, partitions=6)]) == []

    sent: dict[bytes, list[int]] = defaultdict(list)
    async with KafkaProducer(kafka_bootstrap, client_id="test-producer") as producer:
        items = []
        for seq in range(MESSAGES):
            key = f"dataset/object-{seq % KEYS}".encode()
            items.append((key, str(seq).encode()))
            sent[key].append(seq)
        deliveries = await producer.send_many(topic, items)
    assert len(deliveries) == MESSAGES
    # Same key, same partition: that is what makes per-key order possible.
    partitions_per_key: dict[bytes, set[int]] = defaultdict(set)
    for (key, _), delivery in zip(items, deliveries, strict=True):
        partitions_per_key[key].add(delivery.partition)
    assert all(len(p) == 1 for p in partitions_per_key.values())

    group = f"test-group-{uuid.uuid4().hex[:8]}"
    first = await _consume(kafka_bootstrap, topic, group, stop_after=4_000, deadline_s=60)
    assert 4_000 <= len(first) < MESSAGES
    # A new consumer in the same group resumes right after the committed offsets.
    rest = await _consume(
        kafka_bootstrap, topic, group, stop_after=MESSAGES - len(first), deadline_s=60
    )

    received: dict[bytes, list[int]] = defaultdict(list)
    for record in [*first, *rest]:
        assert record.key is not None
        received[record.key].append(int(record.value))
    assert sum(len(v) for v in received.values()) == MESSAGES  # none lost, none twice
    assert received == sent  # every key in the order it was produced


async def test_topics_are_created_with_safe_configuration(kafka_bootstrap: str) -> None:
    async with KafkaAdmin(kafka_bootstrap) as admin:
        await admin.ensure_topics([TopicSpec("meridian.changes", partitions=12)])
        assert await admin.cluster_brokers() == 1
        configs = await admin.describe_topic_config("meridian.changes")
    assert configs["unclean.leader.election.enable"] == "false"


async def test_unknown_topic_is_not_auto_created(kafka_bootstrap: str) -> None:
    topic = f"never.created.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(kafka_bootstrap) as admin:
        assert topic not in await admin.list_topics()
    consumer = KafkaConsumer(
        kafka_bootstrap, topics=[topic], group_id="probe", request_timeout_ms=3000
    )
    with pytest.raises(NotFoundError, match=f"no topic {topic}"):
        await consumer.start()
    await consumer.stop()
    async with KafkaAdmin(kafka_bootstrap) as admin:
        assert topic not in await admin.list_topics()


async def test_clients_bootstrapped_through_the_wan_proxy_stay_on_it(
    stack_settings: Settings, toxiproxy_url: str
) -> None:
    """The WAN listener advertises the proxy, so reconnects cannot bypass injected faults."""
    wan = f"127.0.0.1:{wan_proxy_port(stack_settings)}"
    faults = ToxiproxyClient(toxiproxy_url)
    topic = f"test.wan.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(stack_settings.kafka) as admin:
        await admin.ensure_topics([TopicSpec(topic, partitions=1)])

    async def fastest_send(value: bytes, tries: int = 3) -> float:
        """The fastest of a few sends: one slow answer of a loaded broker says nothing."""
        best = float("inf")
        for _ in range(tries):
            t0 = time.perf_counter()
            await producer.send(topic, b"k", value)
            best = min(best, time.perf_counter() - t0)
        return best

    async with KafkaProducer(wan, client_id="test-wan") as producer:
        await producer.send(topic, b"k", b"warm-up")  # metadata fetched, broker connected
        fast = await fastest_send(b"fast")
        faults.add_latency(KAFKA_WAN_PROXY, latency_ms=100)
        try:
            slow = await fastest_send(b"slow")
        finally:
            faults.remove_toxics(KAFKA_WAN_PROXY)
    # A round trip through the proxy pays 100 ms each way, so every send does; had the
    # client reconnected to the broker's direct address after bootstrap, some would not.
    assert slow >= 0.2 > fast
