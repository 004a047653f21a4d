"""The records the data plane emits for the checkers, read back by chaos/records.py."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from chaos.records import accepts_from_agent_log, applies_from_replicator_log
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.ports.changelog import Delivery, Record
from meridian.convert import encode_change_event
from replicator.dlq import KafkaDeadLetters


def test_agent_accepts_use_the_admission_time_and_include_stale_refusals() -> None:
    lines = [
        json.dumps({"event": "object_stored", "dataset": "ckpt/a", "epoch": 7,
                    "admitted_at": 100.5, "timestamp": "2026-12-01T12:00:00Z"}),
        json.dumps({"event": "stale_epoch_refused", "region": "eu-west", "dataset": "ckpt/a",
                    "epoch": 6, "newest": 7, "timestamp": "2026-12-01T12:00:01Z"}),
        json.dumps({"event": "object_stored", "dataset": "std/s0", "epoch": None,
                    "timestamp": "2026-12-01T12:00:02Z"}),
        "not json",
    ]  # fmt: skip
    got = accepts_from_agent_log(lines, "eu-west", "eu-west-agent", "agent.log")
    assert [(a.epoch, a.accepted) for a in got] == [(7, True), (6, False)]
    assert got[0].t == 100.5
    assert got[1].t == pytest.approx(1796126401.0)


def test_an_apply_record_with_an_unknown_outcome_is_one_clear_error() -> None:
    line = json.dumps({"event": "event_applied", "region": "eu-north", "event_id": "e1",
                       "dataset": "std/s0", "key": "k", "version": "1.0@x",
                       "outcome": "vanished", "t": 1.0})  # fmt: skip
    with pytest.raises(ValueError, match=r"replicator\.log line 1: outcome 'vanished'"):
        applies_from_replicator_log([line], "replicator.log")


def test_a_record_with_stray_stderr_text_around_it_is_still_read() -> None:
    """CI: asyncio's "Task was destroyed" landed after a replicator's record, on its
    line; the checker skipped the line and called the event never processed."""
    record = json.dumps({"event": "event_applied", "region": "eu-central", "event_id": "e1",
                         "dataset": "std/s1", "key": "k", "version": "1.0@x",
                         "outcome": "applied", "t": 2.0})  # fmt: skip
    lines = [
        record + "Task was destroyed but it is pending!",
        "Exception ignored in: " + record.replace('"e1"', '"e2"'),
        "task: <Task pending coro={not json} wait_for=<Future pending>>",
        '{"truncated": ',
    ]
    got = applies_from_replicator_log(lines, "replicator.log")
    assert [(a.event_id, a.outcome, a.t) for a in got] == [
        ("e1", "applied", 2.0),
        ("e2", "applied", 2.0),
    ]


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes, Sequence[tuple[str, bytes]]]] = []

    async def send(
        self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Delivery:
        self.sent.append((topic, key, value, headers))
        return Delivery(topic, 0, len(self.sent))


async def test_a_dead_letter_names_its_dataset_and_an_undecodable_one_none() -> None:
    version = Version.put(HLC(1_700_000_000_000, 0, "eu-west"), 1, Digest.of(b"x"))
    event = ChangeEvent(
        event_id="e1",
        dataset="std/s0",
        key="k",
        version=version,
        origin_region="eu-west",
        policy_revision=3,
        inline=b"x",
    )
    producer = Producer()
    letters = KafkaDeadLetters(producer, "us-east")  # type: ignore[arg-type]
    await letters.send(Record("meridian.changes", 0, 5, b"k", encode_change_event(event)), "r", "d")
    await letters.send(Record("meridian.changes", 0, 6, b"k", b"\xff garbage"), "r", "d")
    headers = [dict(h) for *_rest, h in producer.sent]
    assert [h["dataset"] for h in headers] == [b"std/s0", b""]
