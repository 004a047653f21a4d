"""The outbox drain against a real Kafka: every committed change event reaches
`meridian.changes` and decodes to the same ChangeEvent; per key in commit order; a
Kafka outage (its WAN proxy disabled) only delays them; a SIGKILL of the draining
process at any step loses none and re-sends only the same events (same event_id)."""

from __future__ import annotations

import asyncio
import collections
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from records_helpers import REGION, StoreFactory, records_of
from waiting import until

from agents.daemon.records import RecordDuties
from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings, track_outbox
from agents.store import ObjectStore
from controlplane.adapters.kafka import KafkaProducer
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.domain.events import MAX_EVENT_BYTES, ChangeEvent
from controlplane.loopback import free_port
from controlplane.settings import Settings
from controlplane.stack.kafka import wan_proxy_port
from controlplane.stack.manager import KAFKA_WAN_PROXY
from meridian.convert import decode_change_event

pytestmark = pytest.mark.integration

AGENT = "127.0.0.1:7001"
CHILD = Path(__file__).with_name("outbox_child.py")


@pytest.fixture
async def producer(kafka_bootstrap: str) -> AsyncIterator[KafkaProducer]:
    async with KafkaProducer(kafka_bootstrap, request_timeout_ms=10_000) as p:
        yield p


def _dataset() -> str:
    return f"corpus/outbox-{uuid.uuid4().hex[:8]}"


def _expected(store: ObjectStore, inline_max: int) -> dict[str, ChangeEvent]:
    """The events as the drain must publish them, from the outbox before it runs."""
    out = {}
    for event in store.outbox_pending(limit=10_000):
        version = event.version
        if version is None or version.is_tombstone:
            out[event.event_id] = event.change_event()
        elif version.size <= inline_max:
            data = store.read_bytes(event.dataset, event.key or "", version.hlc)
            out[event.event_id] = event.change_event(inline=data)
        else:
            out[event.event_id] = event.change_event(origin_agent=AGENT)
    return out


def _pending(metrics: AgentMetrics) -> float:
    return metrics.registry.get_sample_value("meridian_outbox_pending") or 0.0


async def test_the_outbox_reaches_kafka_as_the_same_events_in_commit_order(
    store: ObjectStore, metrics: AgentMetrics, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    ds = _dataset()
    put = {"outbox": True, "policy_revision": 3}
    store.put(ds, "small", [b"tiny"], **put)  # type: ignore[arg-type]
    store.put(ds, "large", [b"x" * 100], **put)  # type: ignore[arg-type]
    store.put(ds, "small", [b"tiny again"], **put)  # type: ignore[arg-type]
    store.delete(ds, "large", outbox=True, policy_revision=3)
    for i in range(8):  # a few batches of 3
        store.put(ds, f"k{i}", [b"%d" % i], **put)  # type: ignore[arg-type]
    expected = _expected(store, inline_max=64)
    settings = OutboxSettings(origin_agent=AGENT, inline_max_bytes=64, batch_size=3)
    drain = OutboxDrain(store, producer, metrics, REGION, settings)
    assert len(expected) == 12 and _pending(metrics) == 12

    async with drain:
        await until(lambda: _pending(metrics) == 0, 30, "the outbox to drain")
    assert store.outbox_count() == 0
    assert metrics.registry.get_sample_value("meridian_outbox_published_total") == 12

    records = await records_of(kafka_bootstrap, ds, at_least=12)
    decoded = [decode_change_event(r.value) for r in records]
    assert {e.event_id: e for e in decoded} == expected  # each once, field for field
    assert len(decoded) == 12
    for record, event in zip(records, decoded, strict=True):
        assert record.key == f"{event.dataset}/{event.key}".encode()
    # One object's events share a partition, in commit (HLC) order.
    by_key: dict[bytes, list[tuple[int, int, str]]] = collections.defaultdict(list)
    for record, event in zip(records, decoded, strict=True):
        by_key[record.key or b""].append((record.partition, record.offset, event.version.hlc.text))
    for key, seen in by_key.items():
        assert len({p for p, _, _ in seen}) == 1, key
        assert [h for _, _, h in sorted(seen)] == sorted(h for _, _, h in seen), key
    assert len(by_key[f"{ds}/small".encode()]) == 2


async def test_a_kafka_outage_delays_the_events_and_loses_none(
    store: ObjectStore, metrics: AgentMetrics, stack_settings: Settings, toxiproxy_url: str
) -> None:
    ds = _dataset()
    faults = ToxiproxyClient(toxiproxy_url)
    wan = f"127.0.0.1:{wan_proxy_port(stack_settings)}"
    settings = OutboxSettings(
        origin_agent=AGENT, retry_initial_s=0.05, retry_max_s=0.5, ack_timeout_s=1.0
    )
    async with KafkaProducer(wan, request_timeout_ms=3_000) as producer:
        drain = OutboxDrain(store, producer, metrics, REGION, settings)
        async with drain:
            store.put(ds, "before", [b"b"], outbox=True, policy_revision=1)
            drain.notify()
            await until(lambda: _pending(metrics) == 0, 30, "the first event to be published")
            faults.disable(KAFKA_WAN_PROXY)
            try:
                for i in range(10):
                    store.put(ds, f"k{i}", [b"%d" % i], outbox=True, policy_revision=1)
                    drain.notify()
                await until(lambda: drain.failing is not None, 30, "the drain to see the outage")
                assert _pending(metrics) == 10  # nothing marked without an acknowledgement
            finally:
                faults.enable(KAFKA_WAN_PROXY)
            await until(lambda: _pending(metrics) == 0, 60, "the drain to catch up")
    records = await records_of(stack_settings.kafka, ds, at_least=11)
    assert {decode_change_event(r.value).key for r in records} == {"before"} | {
        f"k{i}" for i in range(10)
    }


@pytest.mark.parametrize("step", ["mid-send", "after-ack", "after-mark"])
async def test_a_sigkill_while_draining_loses_no_event_and_resends_the_same(
    open_store: StoreFactory,
    metrics: AgentMetrics,
    producer: KafkaProducer,
    kafka_bootstrap: str,
    step: str,
) -> None:
    ds = _dataset()
    store = open_store()
    for i in range(20):  # four batches of 5 in the child
        store.put(ds, f"k{i}", [b"content %d" % i], outbox=True, policy_revision=1)
    expected = _expected(store, inline_max=OutboxSettings(origin_agent=AGENT).inline_max_bytes)
    root = store.root
    store.close()

    argv = [sys.executable, str(CHILD), str(root), kafka_bootstrap, step]
    child = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, timeout=120, check=False
    )
    assert child.returncode == -9, child.stderr.decode()[-2000:]

    store = open_store()
    left = store.outbox_count()
    # Batch 1 was marked; batch 2 was marked only when the kill came after its mark.
    assert left == (10 if step == "after-mark" else 15)
    async with OutboxDrain(store, producer, metrics, REGION, OutboxSettings(origin_agent=AGENT)):
        await until(lambda: _pending(metrics) == 0, 30, "the restarted drain to finish")

    resends = {"mid-send": 2, "after-ack": 5, "after-mark": 0}[step]
    # Every record, resends too: a slow fetch must not end the read before them.
    records = await records_of(kafka_bootstrap, ds, at_least=20 + resends)
    decoded = [decode_change_event(r.value) for r in records]
    copies = collections.Counter(e.event_id for e in decoded)
    assert set(copies) == set(expected)  # none lost, none invented
    for event in decoded:
        assert event == expected[event.event_id]  # a re-send is the same event
    resent = sum(copies.values()) - len(copies)
    # mid-send: half of batch 2 reached Kafka before the kill and went again; after-ack:
    # all of it did; after-mark: nothing is sent twice.
    assert resent == resends


def test_the_pending_gauge_reads_the_outbox_before_any_drain_exists(
    store: ObjectStore, metrics: AgentMetrics
) -> None:
    """A daemon whose drain waits for Kafka still shows the backlog (and after a
    restart, the backlog the last run left)."""
    track_outbox(store, metrics)
    assert _behind(metrics) == 0.0  # nothing waits
    store.put(_dataset(), "k", [b"x"], outbox=True, policy_revision=1)
    assert _pending(metrics) == 1
    # Committed an hour ago (as after a long Kafka outage): the oldest event's age.
    with sqlite3.connect(store.root / "meta.db") as db:
        db.execute("UPDATE outbox SET created_ms = created_ms - 3600000")
    assert 3600 <= _behind(metrics) < 3700
    store.outbox_published([e.event_id for e in store.outbox_pending()])
    assert (_pending(metrics), _behind(metrics)) == (0, 0.0)


def _behind(metrics: AgentMetrics) -> float:
    value = metrics.registry.get_sample_value("meridian_outbox_behind_seconds")
    assert value is not None
    return value


async def test_a_put_pruned_before_it_is_sent_is_not_sent(
    open_store: StoreFactory,
    metrics: AgentMetrics,
    producer: KafkaProducer,
    kafka_bootstrap: str,
) -> None:
    # Kafka was away while the key was rewritten past keep_versions: the first put's
    # bytes are gone here, so no region could fetch it (a consumer failed it, and
    # paged). It is not sent; the newer versions' events are.
    store = open_store(keep_versions=2)
    ds = _dataset()
    put = {"outbox": True, "policy_revision": 3}
    versions = [store.put(ds, "big", [b"%d" % i * 100], **put) for i in range(3)]  # type: ignore[arg-type]
    settings = OutboxSettings(origin_agent=AGENT, inline_max_bytes=64, batch_size=10)
    drain = OutboxDrain(store, producer, metrics, REGION, settings)
    async with drain:
        await until(lambda: _pending(metrics) == 0, 30, "the outbox to drain")
    records = await records_of(kafka_bootstrap, ds, at_least=2)
    sent = [decode_change_event(r.value).version for r in records]
    assert sent == versions[1:]
    # Counted, not only logged, so that the drops show on the agent's metrics.
    assert metrics.registry.get_sample_value("meridian_outbox_superseded_total") == 1
    assert metrics.registry.get_sample_value("meridian_outbox_published_total") == 2


def test_an_event_over_kafkas_request_limit_goes_by_address(
    store: ObjectStore, metrics: AgentMetrics
) -> None:
    # Inline up to 1 MiB is allowed, but Kafka takes no request over 1 MiB with its
    # overhead: refused, the event would be retried for ever and hold the rest back.
    ds = _dataset()
    store.put(ds, "mib", [b"m" * (1024 * 1024)], outbox=True, policy_revision=3)
    store.put(ds, "small", [b"s"], outbox=True, policy_revision=3)
    settings = OutboxSettings(origin_agent=AGENT, inline_max_bytes=1024 * 1024)
    drain = OutboxDrain(store, None, metrics, REGION, settings)  # type: ignore[arg-type]
    batch = drain._encode(store.outbox_pending(limit=10))
    assert not batch.bad and len(batch.records) == 2
    big, small = (decode_change_event(value) for _, value in batch.records)
    assert (big.inline, big.origin_agent) == (None, AGENT)
    assert small.inline == b"s"
    assert all(len(k) + len(v) <= MAX_EVENT_BYTES for k, v in batch.records)


async def test_the_agents_outbox_gauges_show_a_backlog_while_kafka_is_away(
    store: ObjectStore, metrics: AgentMetrics, catalog_url: str
) -> None:
    """An agent started during a Kafka outage has no drain yet (it waits for Kafka), yet
    its outbox's backlog and age show at once: the alert on the age reads them."""
    store.put(_dataset(), "k", [b"x"], outbox=True, policy_revision=1)
    with sqlite3.connect(store.root / "meta.db") as db:
        db.execute("UPDATE outbox SET created_ms = created_ms - 3600000")
    settings = Settings(kafka=f"127.0.0.1:{free_port()}", catalog=catalog_url)
    duties = RecordDuties(store, metrics, REGION, settings, origin_agent=AGENT)
    await duties.start()
    try:
        assert duties.drain is None  # still waiting for Kafka
        assert _pending(metrics) == 1
        assert 3600 <= _behind(metrics) < 3700
    finally:
        await duties.stop()
