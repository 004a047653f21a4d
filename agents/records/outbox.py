"""The outbox drain: publishes the store's change events to Kafka `meridian.changes`.

The store commits a standard write's change event in its outbox in the same
SQLite transaction as the write (dataplane.md, *Classes*). This duty reads the
oldest events in commit order, a bounded batch at a time (loop.py), encodes each
as a protobuf `ChangeEvent` (key `dataset/key`; `schema` set; inline bytes up to
`inline_max_bytes`, else this agent's address to fetch from), sends the batch
through the idempotent, `acks=all` producer (controlplane/adapters/kafka.py), and
only once the broker has acknowledged every record of it removes them from the
outbox (`outbox_published`).

Guarantees, and why:
- No event is lost: an event leaves the outbox only after its acknowledgement, and
  the outbox is as durable as the write itself. A SIGKILL at any point leaves it
  in the outbox or acknowledged (or both).
- No event is published twice *as a different event*: the event id is chosen
  once, when the write commits, and stored with it, so an event sent again after
  a crash (acknowledged, not yet removed) or after a failed batch is the same
  event with the same `event_id` and version. Consumers dedup on `event_id`, and
  in any case applying one version twice is a no-op by LWW (an equal HLC is not
  applied). The content source of a re-send may differ (inline the first time,
  the agent's address once the version has been pruned), never the version.
- Per key, events go out in commit order: batches are sent in outbox order through
  one producer (same key, same partition, in order). After a failed batch a
  re-send can put an older copy of an event after a newer one of the same key
  (`A B A B`); LWW on the HLC makes that harmless.
- Version-set events (`kind = set`, a set committed here) go out in the same
  batches, in the same commit order, with the same guarantees: a `ChangeEvent` of
  schema 2 carrying the set record (`SetEvent`: id, HLC, each member's version),
  keyed `dataset NUL set/<id>` (`set_log_key`) so that one set id's events share a
  partition, in order, and never share a key with an object. They follow their
  members' own events in the outbox (the members were committed first), but not
  necessarily on Kafka (other partitions): the applier takes them in any order. They
  count as pending like the others.
- An event that cannot be encoded (e.g. written without a policy revision) is set
  aside with its reason (setaside.py) and removed, so it cannot wedge the queue.
- Kafka down: aiokafka keeps retrying a batch rather than failing it, so after
  `ack_timeout_s` without an acknowledgement the drain reports Kafka unavailable
  (logged, `failing`) and keeps waiting for that same batch, without sending it
  again; a batch the producer fails is read again from the outbox and re-sent with
  the same event ids, after a backoff.

`meridian_outbox_pending` is read from the outbox when scraped (right after a
restart too); `meridian_outbox_published_total` counts acknowledged events,
`meridian_outbox_superseded_total` the events dropped unsent (`_SupersededError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from agents.metrics import AgentMetrics
from agents.records.loop import BatchDuty, log
from agents.records.setaside import SetAside
from agents.records.settings import OutboxSettings
from agents.store.errors import MissingContentError
from agents.store.model import JsonValue, OutboxEvent
from agents.store.store import ObjectStore
from controlplane.controller.duty import describe
from controlplane.domain.errors import VersionError
from controlplane.domain.events import MAX_EVENT_BYTES, ChangeEvent, SetEvent
from controlplane.domain.version import Version
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.errors import MeridianError, NotFoundError, UnavailableError
from controlplane.lifecycle import cancel_and_wait
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Delivery
from meridian.convert import encode_change_event, encode_set_event

SET_ASIDE_FILE = "outbox-set-aside.jsonl"


class BatchProducer(Protocol):
    """What the drain needs of a producer (`KafkaProducer` is one): send records in
    order and return once every one is durable (acks=all), or raise
    UnavailableError (retriable) having possibly written some of them."""

    async def send_many(
        self, topic: str, items: Sequence[tuple[bytes, bytes]]
    ) -> list[Delivery]: ...


@dataclasses.dataclass(frozen=True)
class _Batch:
    records: list[tuple[bytes, bytes]]
    event_ids: list[str]
    bad: list[tuple[OutboxEvent, str]]
    superseded: list[str]  # ids of events not sent: see `_SupersededError`


class _SupersededError(Exception):
    """The event's put was pruned here, a newer version of its key being held: no
    region could fetch it (the consumer of a large one failed it, and paged), and
    the newer version's own event follows it on the same key."""


class OutboxDrain(BatchDuty):
    name = "outbox"

    def __init__(
        self,
        store: ObjectStore,
        producer: BatchProducer,
        metrics: AgentMetrics,
        region: str,
        settings: OutboxSettings,
        policy: Callable[[], CompiledPolicy | None] | None = None,
    ) -> None:
        # Every region's replicator reads the whole change log: bytes inline in an
        # event reach them all, so they ride inline only when every region of the
        # applied topology may hold the dataset (else the event names the origin agent,
        # whose sender checks each receiver's residency). No policy known: by address.
        self._policy = policy
        super().__init__(
            region,
            batch_size=settings.batch_size,
            idle_interval_s=settings.idle_interval_s,
            retry_initial_s=settings.retry_initial_s,
            retry_max_s=settings.retry_max_s,
            stop_timeout_s=settings.stop_timeout_s,
        )
        self._store = store
        self._producer = producer
        self._metrics = metrics
        self.settings = settings
        self.set_aside = SetAside(store.root / SET_ASIDE_FILE)
        self._gauge = track_outbox(store, metrics)
        self._inflight: tuple[asyncio.Task[list[Delivery]], _Batch] | None = None

    def pending(self) -> int:
        """Change events committed and not yet acknowledged by Kafka."""
        return self._gauge()

    async def step(self) -> int:
        if self._inflight is None:
            events = await asyncio.to_thread(self._store.outbox_pending, self.batch_size)
            if not events:
                return 0
            batch = await asyncio.to_thread(self._encode, events)
            if batch.superseded:
                await asyncio.to_thread(self._store.outbox_published, batch.superseded)
                self._metrics.outbox_superseded.inc(len(batch.superseded))
                log.info("outbox_superseded", region=self.region, events=len(batch.superseded))
            if batch.bad:
                for event, reason in batch.bad:
                    await asyncio.to_thread(self.set_aside.keep, "outbox", _as_json(event), reason)
                    self._metrics.records_set_aside.labels(queue="outbox").inc()
                await asyncio.to_thread(
                    self._store.outbox_published, [event.event_id for event, _ in batch.bad]
                )
            send = self._producer.send_many(self.settings.topic, batch.records)
            self._inflight = (asyncio.create_task(send), batch)
        task, batch = self._inflight
        try:
            # Shielded: a batch that is slow to be acknowledged is waited for again at
            # the next step rather than sent again (the producer retries it meanwhile).
            await asyncio.wait_for(asyncio.shield(task), self.settings.ack_timeout_s)
        except TimeoutError:
            raise UnavailableError(
                f"Kafka has not acknowledged {len(batch.event_ids)} change events within "
                f"{self.settings.ack_timeout_s} s; still waiting for them"
            ) from None
        except Exception:
            if task.done():
                self._inflight = None  # refused: read them again (same event ids) next step
            raise
        self._inflight = None
        # Acknowledged (acks=all): only now may they leave the outbox.
        await asyncio.to_thread(self._store.outbox_published, batch.event_ids)
        self._metrics.outbox_published.inc(len(batch.event_ids))
        log.debug(
            "outbox_published",
            region=self.region,
            events=len(batch.event_ids),
            set_aside=len(batch.bad),
        )
        return len(batch.event_ids) + len(batch.bad) + len(batch.superseded)

    async def _do_stop(self) -> None:
        await super()._do_stop()
        if self._inflight is not None:
            task, self._inflight = self._inflight[0], None
            await cancel_and_wait(task)  # not acknowledged: still in the outbox

    def _encode(self, events: list[OutboxEvent]) -> _Batch:
        records: list[tuple[bytes, bytes]] = []
        ids: list[str] = []
        bad: list[tuple[OutboxEvent, str]] = []
        superseded: list[str] = []
        for event in events:
            try:
                if event.kind == "set":
                    set_event = _set_event(event)
                    key, value = set_event.log_key, encode_set_event(set_event)
                else:
                    key = f"{event.dataset}/{event.key}"
                    change = self._change_event(event)
                    value = encode_change_event(change)
                    if len(key.encode()) + len(value) > MAX_EVENT_BYTES and change.inline:
                        # Over what Kafka takes in one request: by address instead.
                        change = event.change_event(origin_agent=self.settings.origin_agent)
                        value = encode_change_event(change)
                if len(key.encode()) + len(value) > MAX_EVENT_BYTES:
                    # Never sendable (a set of very many members): refused by Kafka, it
                    # would be retried for ever and hold every later event behind it.
                    raise VersionError(
                        f"outbox event {event.event_id} is {len(value)} bytes encoded, over "
                        f"the change log's {MAX_EVENT_BYTES}-byte limit per event"
                    )
            except _SupersededError:
                superseded.append(event.event_id)
                continue
            except MeridianError as exc:
                if exc.retriable:
                    raise
                bad.append((event, describe(exc)))
                continue
            records.append((key.encode(), value))
            ids.append(event.event_id)
        return _Batch(records, ids, bad, superseded)

    def _inline_allowed(self, dataset: str) -> bool:
        if self._policy is None:  # no policy source (a store-only test): as before
            return True
        return _everywhere_allowed(self._policy(), dataset)

    def _change_event(self, event: OutboxEvent) -> ChangeEvent:
        version = event.version
        if version is None or version.is_tombstone:
            return event.change_event()
        if (
            event.key is not None
            and version.size <= self.settings.inline_max_bytes
            and self._inline_allowed(event.dataset)
        ):
            try:
                data = self._store.read_bytes(event.dataset, event.key, version.hlc)
            except NotFoundError:
                self._check_superseded(event.dataset, event.key, version)
            except MissingContentError:
                pass  # lost since: the consumer fetches it from another holder
            else:
                return event.change_event(inline=data)
        elif event.key is not None:
            try:
                self._store.stat(event.dataset, event.key, version.hlc, include_deleted=True)
            except NotFoundError:
                self._check_superseded(event.dataset, event.key, version)
        return event.change_event(origin_agent=self.settings.origin_agent)

    def _check_superseded(self, dataset: str, key: str, version: Version) -> None:
        """Raise `_SupersededError` when `version` is gone from here and a newer one is held;
        else (the object gone altogether: evicted, expired) the consumer tries the
        other holders."""
        head = self._store.head(dataset, key)
        if head is not None and head.hlc > version.hlc:
            raise _SupersededError(f"{dataset}/{key} at {version.hlc}")


def _set_event(event: OutboxEvent) -> SetEvent:
    """The change log's form of a `set` outbox row; VersionError (set aside) for one
    without a set HLC, members or a policy revision."""
    if event.set_id is None or event.set_hlc is None:
        raise VersionError(f"outbox event {event.event_id} is a set row without its set or HLC")
    members = tuple(SetMember(key, hlc) for key, hlc in sorted(event.members.items()))
    return SetEvent(
        event_id=event.event_id,
        version_set=VersionSet(event.dataset, event.set_id, members, event.set_hlc),
        origin_region=event.origin_region,
        policy_revision=event.policy_revision or 0,
        epoch=event.epoch,
    )


def _everywhere_allowed(policy: CompiledPolicy | None, dataset: str) -> bool:
    if policy is None:
        return False
    placement = policy.placement(dataset)
    if placement is None:
        return False
    return all(j in placement.residency for j in policy.regions.values())


def track_outbox(store: ObjectStore, metrics: AgentMetrics) -> Callable[[], int]:
    """Make `meridian_outbox_pending` and `meridian_outbox_behind_seconds` read the
    store's outbox when scraped, and return the first reader. The drain does it; a
    daemon whose drain waits for Kafka to start can call it first, so the gauges show
    the backlog meanwhile (with Kafka away the outbox grows by a row per write: the
    age says for how long, and the alert on it names the region the events wait in)."""
    last = 0
    behind = 0.0

    def pending() -> int:
        nonlocal last
        with contextlib.suppress(MeridianError):  # closing: the last value read
            last = store.outbox_count()
        return last

    def age() -> float:
        nonlocal behind
        with contextlib.suppress(MeridianError):
            oldest = store.outbox_oldest_ms()
            now_ms = time.time_ns() // 1_000_000
            behind = 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
        return behind

    metrics.outbox_pending.set_function(pending)
    metrics.outbox_behind.set_function(age)
    return pending


def _as_json(event: OutboxEvent) -> dict[str, JsonValue]:
    version = event.version
    return {
        "seq": event.seq,
        "event_id": event.event_id,
        "dataset": event.dataset,
        "key": event.key,
        "hlc": None if version is None else version.hlc.text,
        "op": None if version is None else version.op,
        "size": None if version is None else version.size,
        "digest": None if version is None or version.digest is None else version.digest.text,
        "set": event.set_id,
        "set_hlc": None if event.set_hlc is None else event.set_hlc.text,
        "members": {k: v.text for k, v in event.members.items()},
        "origin_region": event.origin_region,
        "epoch": event.epoch,
        "policy_revision": event.policy_revision,
    }
