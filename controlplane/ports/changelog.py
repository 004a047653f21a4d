"""Port of the change log (Kafka): ordered, durable, at-least-once delivery of change events.

Guarantees a producer adapter must give:
- Idempotent and durable: a record is acknowledged only once every in-sync replica
  has it (`acks=all`), and retries after a lost acknowledgement never duplicate it
  (idempotent producer). Topics refuse unclean leader election, so an acknowledged
  record is never lost to a failover of the log itself.
- Ordered per key: every record with the same key goes to the same partition, in
  the order `send` was awaited.

Guarantees a consumer adapter must give:
- At least once: offsets are committed only by `commit`, never automatically, so a
  crash between processing and commit replays records rather than losing them.
  A consumer that restarts resumes right after the last committed offset.
- Callers that need exactly-once effects make their processing idempotent (the
  catalog's write API is, keyed by caller-chosen ids) and commit after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Delivery:
    """Where an acknowledged record was written."""

    topic: str
    partition: int
    offset: int


class ChangeLogAdmin(Protocol):
    async def ensure_topics(self, topics: Sequence[TopicSpec]) -> list[str]:
        """Create the topics that are missing; return the names created. Never alters others."""
        ...

    async def cluster_brokers(self) -> int:
        """Number of live brokers, from a real metadata request."""
        ...


class ChangeLogProducer(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Delivery:
        """Return once the record is durable (acks=all); raise UnavailableError if it is not."""
        ...


class RebalanceHandler(Protocol):
    """Told by a group consumer when partitions move (a rebalance), as (topic, partition).

    `on_revoked` runs before the partitions go to another member, after fetching from
    them stopped: the place to finish what is in flight and commit it. `on_assigned`
    runs once the new assignment is known, before records of it are returned."""

    async def on_revoked(self, partitions: set[tuple[str, int]]) -> None: ...

    async def on_assigned(self, partitions: set[tuple[str, int]]) -> None: ...


class ChangeLogConsumer(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        """The next records of the assigned partitions, in offset order per partition."""
        ...

    async def commit(self, records: Sequence[Record]) -> None:
        """Commit, per partition, the offset just after the highest of these records."""
        ...
