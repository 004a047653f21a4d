"""Dead letters: an event a region will not apply goes to `meridian.dlq`, with the
original bytes (so nothing is lost to a bug in decoding) and the reason; the
replicator then moves on (dataplane.md, *Change events*). One exception: a letter
of a residency refusal withholds the object's inline bytes (`without_inline_bytes`),
since the letter is written by the region that may not hold them.

The record keeps the original key and value; headers say why (`reason`, the short
category that `meridian_dlq_total{reason}` counts, and `detail`, the sentence), who
refused it (`region`) and where it came from (`source`: topic/partition/offset).
`dataset` names the event's dataset (empty when the bytes do not decode), so the
chaos suite's residency inventory can attribute every dead letter's payload.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from controlplane.adapters.kafka import DLQ_TOPIC
from controlplane.domain.errors import MessageError
from controlplane.domain.events import ChangeEvent, LogEvent
from controlplane.ports.changelog import ChangeLogProducer, Record
from meridian.convert import decode_log_event, encode_log_event

# The reasons counted (`meridian_dlq_total{reason}`).
UNDECODABLE = "undecodable"
CLOCK_SKEW = "clock skew"
RESIDENCY = "residency"
STALE_EPOCH = "stale epoch"
REJECTED = "rejected"

# Stands where the withheld inline bytes were: a put needs a content source, and
# this one names why there is none (no agent answers to it).
WITHHELD = "withheld: residency"


def without_inline_bytes(record: Record, event: LogEvent) -> Record:
    """`record` with its event's inline bytes left out (names, version and digest
    kept), for a letter written where the bytes may not live."""
    if not isinstance(event, ChangeEvent) or event.inline is None:
        return record
    kept = replace(event, inline=None, origin_agent=WITHHELD)
    return replace(record, value=encode_log_event(kept))


class DeadLetters(Protocol):
    async def send(self, record: Record, reason: str, detail: str) -> None:
        """Return once the dead letter is durable (acks=all)."""
        ...


class KafkaDeadLetters:
    def __init__(self, producer: ChangeLogProducer, region: str) -> None:
        self._producer = producer
        self._region = region

    async def send(self, record: Record, reason: str, detail: str) -> None:
        await self._producer.send(
            DLQ_TOPIC.name,
            record.key or b"",
            record.value,
            headers=[
                ("reason", reason.encode()),
                ("detail", detail.encode()),
                ("region", self._region.encode()),
                ("source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
                ("dataset", _dataset_of(record).encode()),
            ],
        )


def _dataset_of(record: Record) -> str:
    try:
        return decode_log_event(record.value).dataset
    except MessageError:
        return ""
