"""In-memory fakes of the replicator's ports (`replicator.ports`), for unit tests.

`MemoryAgent` applies by the domain's `lww()` as the real agent does, keeps every
effect it had (so a test can count double effects), and can be told to fail or to
hold a call until released. `MemoryLog` is a one-topic change log with committed
offsets per partition; `MemoryDeadLetters` keeps dead letters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.catalog.records import TransferRecord
from controlplane.domain.events import ChangeEvent
from controlplane.domain.version import Verdict, Version, lww
from controlplane.errors import MeridianError, UnavailableError
from controlplane.ports.changelog import Record
from replicator.ports import ApplyOutcome, ApplyResult, Source

_OUTCOME = {
    Verdict.APPLY: ApplyOutcome.APPLIED,
    Verdict.SAME: ApplyOutcome.SAME,
    Verdict.OLDER: ApplyOutcome.OLDER,
    Verdict.COLLISION: ApplyOutcome.COLLISION,
}


@dataclass
class Effect:
    dataset: str
    key: str
    version: Version
    how: str  # "inline", "delete" or "fetch"


@dataclass
class MemoryAgent:
    held: dict[tuple[str, str], Version] = field(default_factory=dict)
    content: dict[tuple[str, str], bytes] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (how, event_id)
    batches: list[int] = field(default_factory=list)  # sizes of apply_many calls
    fetch_sources: list[list[Source]] = field(default_factory=list)
    # Raised by the next calls, in order (then calls succeed again).
    failures: list[BaseException] = field(default_factory=list)
    # While > 0, every call (head included) fails as an unreachable agent, counting down.
    down_calls: int = 0
    # When set, calls wait for it (tests hold calls to observe concurrency).
    gate: asyncio.Event | None = None
    running: int = 0
    max_running: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _reachable(self) -> None:
        if self.down_calls > 0:
            self.down_calls -= 1
            raise UnavailableError("the agent at 127.0.0.1:7400 failed the call (UNAVAILABLE)")

    async def _apply(self, event: ChangeEvent, how: str, data: bytes | None) -> ApplyResult:
        self._reachable()
        self.calls.append((how, event.event_id))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        await self._notify()
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
            if self.failures:
                raise self.failures.pop(0)
            name = (event.dataset, event.key)
            verdict = lww(event.version, self.held.get(name))
            if verdict.applies:
                self.held[name] = event.version
                if data is not None:
                    self.content[name] = data
                else:
                    self.content.pop(name, None)
                self.effects.append(Effect(event.dataset, event.key, event.version, how))
            return ApplyResult(_OUTCOME[verdict], self.held.get(name))
        finally:
            self.running -= 1
            await self._notify()

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        return await self._apply(event, "inline", event.inline)

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        return await self._apply(event, "delete", None)

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        self.fetch_sources.append(list(sources))
        if not sources:
            raise MeridianError("no source to fetch from")
        return await self._apply(event, "fetch", b"fetched")

    async def apply_many(self, events: Sequence[ChangeEvent]) -> list[ApplyResult | Exception]:
        """One call: the agent away fails it whole; an item's own failure (the next of
        `failures`) is its answer."""
        self._reachable()
        self.batches.append(len(events))
        out: list[ApplyResult | Exception] = []
        for e in events:
            how = "delete" if e.version.is_tombstone else "inline"
            try:
                out.append(await self._apply(e, how, None if how == "delete" else e.inline))
            except MeridianError as exc:
                out.append(exc)
        return out

    async def head(self, dataset: str, key: str) -> Version | None:
        self._reachable()
        return self.held.get((dataset, key))


@dataclass
class MemoryDeadLetters:
    letters: list[tuple[Record, str, str]] = field(default_factory=list)

    async def send(self, record: Record, reason: str, detail: str) -> None:
        self.letters.append((record, reason, detail))


class MemoryLog:
    """A change log of one topic; `poll` hands out each appended record once (a
    redelivery is modelled by `rewind`), `commit` keeps the offset per partition."""

    def __init__(self, topic: str = "meridian.changes", partitions: int = 4) -> None:
        self.topic = topic
        self.partitions = partitions
        self.records: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        self.position: dict[int, int] = dict.fromkeys(range(partitions), 0)
        self.committed: dict[int, int] = dict.fromkeys(range(partitions), 0)
        self.commits: list[dict[int, int]] = []
        self.changed = asyncio.Condition()  # notified at each commit
        self._arrived = asyncio.Event()

    def append(self, key: bytes, value: bytes, partition: int | None = None) -> Record:
        p = partition if partition is not None else hash(key) % self.partitions
        record = Record(self.topic, p, len(self.records[p]), key, value)
        self.records[p].append(record)
        self._arrived.set()
        return record

    def rewind(self) -> None:
        """Redeliver from the committed offsets (a restart or a rebalance)."""
        self.position = dict(self.committed)
        self._arrived.set()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        out: list[Record] = []
        for p in range(self.partitions):
            while self.position[p] < len(self.records[p]) and len(out) < max_records:
                out.append(self.records[p][self.position[p]])
                self.position[p] += 1
        if not out:
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        return out

    async def commit(self, records: Sequence[Record]) -> None:
        done: dict[int, int] = {}
        for r in records:
            done[r.partition] = max(done.get(r.partition, 0), r.offset + 1)
        for p, off in done.items():
            if off < self.committed[p]:
                raise AssertionError(f"offset of partition {p} committed backwards")
            self.committed[p] = off
        self.commits.append(done)
        async with self.changed:
            self.changed.notify_all()

    def lag(self) -> int:
        return sum(len(self.records[p]) - self.committed[p] for p in range(self.partitions))


@dataclass
class MemoryReplicaRecords:
    """`replicator.ports.ReplicaRecords` in memory: the replica states written."""

    versions: dict[tuple[str, str, str], str] = field(default_factory=dict)
    states: dict[tuple[str, str, str, str], tuple[str, str | None]] = field(default_factory=dict)
    transfers: dict[str, TransferRecord] = field(default_factory=dict)
    down: bool = False

    def _check(self) -> None:
        if self.down:
            from controlplane.catalog.errors import CatalogUnavailableError

            raise CatalogUnavailableError("the catalog is down (test)")

    def register_version(
        self, dataset: str, key: str, version: str, digest: str, **kw: object
    ) -> None:
        self._check()
        self.versions[(dataset, key, version)] = str(kw.get("op", "put"))

    def set_replica_state(
        self, dataset: str, key: str, version: str, region: str, state: str, **kw: object
    ) -> None:
        self._check()
        error = kw.get("error")
        self.states[(dataset, key, version, region)] = (
            state,
            None if error is None else str(error),
        )

    def record_transfer(self, rec: TransferRecord) -> None:
        self._check()
        self.transfers[rec.id] = rec
