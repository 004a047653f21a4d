"""The residency inventory beyond the agents' disks: the catalog and the dead letters.

* **Catalog** (read straight from PostgreSQL, read-only): every `replicas` row in
  state `completed` is the catalog's claim that a region holds that version's
  bytes; every `transfers` row with outcome `completed` says bytes reached its
  `to_region`. A claim outside residency is as bad as the bytes themselves: it is
  what a later read or failover would trust.
* **Dead letters** (`meridian.dlq`, this run's records): a dead letter keeps the
  original event, so when that event carried the object's bytes inline the bytes
  now sit in a record written by the refusing region (header `region`); the
  `dataset` header attributes it (empty or missing: unattributed, counted as the
  worst dataset). A dead letter without inline bytes holds only names and is not a
  copy.
"""

from __future__ import annotations

import asyncio

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from chaos.records import Copy
from controlplane.adapters.kafka import DLQ_TOPIC
from controlplane.domain.errors import MessageError
from controlplane.domain.events import SetEvent
from meridian.convert import decode_log_event

REPLICAS = """
SELECT r.id, r.region, o.dataset, o.key
FROM replicas r
JOIN object_versions v ON v.id = r.version_id
JOIN objects o ON o.id = v.object_id
WHERE r.state = 'completed'
"""
TRANSFERS = "SELECT id, to_region, dataset, object FROM transfers WHERE outcome = 'completed'"


def catalog_copies(conninfo: str) -> list[Copy]:
    """`conninfo`: a libpq URL of the run's catalog database."""
    out: list[Copy] = []
    with psycopg.connect(conninfo, connect_timeout=5) as conn:
        for rid, region, dataset, key in conn.execute(REPLICAS):
            out.append(
                Copy(str(region), str(dataset), str(key), "catalog_replica", f"replicas/{rid}")
            )
        for tid, region, dataset, key in conn.execute(TRANSFERS):
            out.append(
                Copy(str(region), str(dataset), str(key), "catalog_transfer", f"transfers/{tid}")
            )
    return out


def dlq_copy(
    headers: dict[str, bytes], value: bytes | None, partition: int, offset: int
) -> Copy | None:
    """One dead letter as a copy, or None when it holds no bytes of an object."""
    try:
        decoded = decode_log_event(value or b"")
    except MessageError:
        decoded = None  # undecodable: its bytes may be anything, so they count
    if isinstance(decoded, SetEvent):
        return None  # a version set's event names versions, it holds no bytes
    event = decoded
    if event is not None and not event.inline:
        return None
    region = headers.get("region", b"").decode("utf-8", errors="replace")
    dataset = headers.get("dataset", b"").decode("utf-8", errors="replace") or None
    key = event.key if event is not None else ""
    return Copy(region or "?", dataset, key, "dlq", f"{DLQ_TOPIC.name}/{partition}/{offset}")


async def dlq_copies(bootstrap: str, since_ms: int, timeout_s: float = 20.0) -> list[Copy]:
    """This run's dead letters (record timestamps from `since_ms` on) that hold bytes."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=10_000
    )
    out: list[Copy] = []
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        await asyncio.wait_for(consumer.topics(), 5)
        parts = consumer.partitions_for_topic(DLQ_TOPIC.name) or set(range(DLQ_TOPIC.partitions))
        tps = [TopicPartition(DLQ_TOPIC.name, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _ in range(100_000):  # bounded by count and by the deadline
            left = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
            if not left or loop.time() >= deadline:
                break
            batch = await consumer.getmany(*left, timeout_ms=500, max_records=1000)
            for tp, records in batch.items():
                for rec in records:
                    if rec.timestamp < since_ms:
                        continue
                    headers = {k: bytes(v) for k, v in (rec.headers or ())}
                    copy = dlq_copy(headers, rec.value, tp.partition, rec.offset)
                    if copy is not None:
                        out.append(copy)
    finally:
        await consumer.stop()
    return out
