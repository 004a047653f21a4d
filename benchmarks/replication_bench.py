"""Replication benchmark (issue 12): the replicator's apply path on the local stack, one run.

    MERIDIAN_KAFKA=127.0.0.1:9092 python benchmarks/replication_bench.py [--objects 20000]

What it measures, each against a real Kafka broker, with the real `ObjectStore`:

1. apply throughput of 1 KiB inline objects into one region: N change events are
   published to a fresh topic, then the replicator's loop (`ReplicatorLoop` +
   `Applier`, the code `meridian replicator run` runs) consumes them with its
   group, applies each through an `AgentPort` over an in-process store, journals
   it and commits offsets once the effects are durable; timed from start to the
   last offset committed. Beside it, in the same run on the same topic, the bare
   loop the issue names: aiokafka consume → write each value to its own file with
   fsync → commit. Two store adapters are measured: one `ObjectStore.apply` per
   event, and group commit (`apply_many` of what arrives together), which is what
   the agent must do to pass 5,000/s;
2. end-to-end lag at a steady 1,000 writes/s of 1 KiB: publish acknowledged (the
   event's HLC wall time) → committed in the region's store, p50 and p99.

What it cannot measure yet, and why: the three-region run (real `meridian agent
serve` processes with the outbox drain and transfers are not on main), the 1 MiB
and 64 MiB objects (fetched by `Sync` between agents), the partition drain after
a 60 s Toxiproxy partition, and "write acked at origin" (it starts at the Kafka
ack here, not at the origin agent's outbox).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.store import ObjectStore
from controlplane.adapters.kafka import KafkaAdmin, KafkaConsumer, KafkaProducer
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.placement import Placement
from controlplane.domain.version import Digest, Verdict, Version
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Record, TopicSpec
from meridian.convert import encode_change_event
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.ports import ApplyOutcome, ApplyResult, Source
from replicator.service import ReplicatorLoop

KiB = 1024
REGION = "eu-central"
DATASET = "corpus/bench"
_OUTCOMES = {
    Verdict.APPLY: ApplyOutcome.APPLIED,
    Verdict.SAME: ApplyOutcome.SAME,
    Verdict.OLDER: ApplyOutcome.OLDER,
    Verdict.COLLISION: ApplyOutcome.COLLISION,
}


class StoreAgent:
    """`AgentPort` over an in-process store: one `apply` per event, in a thread."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.committed_at: dict[str, float] = {}  # event key -> time.time() of its commit

    async def _apply(self, event: ChangeEvent) -> ApplyResult:
        source = None if event.version.is_tombstone else [event.inline or b""]
        r = await asyncio.to_thread(
            self.store.apply, event.dataset, event.key, event.version, source
        )
        self.committed_at[event.key] = time.time()
        return ApplyResult(_OUTCOMES[r.verdict], r.newest)

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        return await self._apply(event)

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        return await self._apply(event)

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        raise NotImplementedError("inline objects only")

    async def head(self, dataset: str, key: str) -> Version | None:
        return self.store.head(dataset, key)


class NullAgent(StoreAgent):
    """Applies nothing (answers APPLIED at once): the replicator's own ceiling."""

    async def _apply(self, event: ChangeEvent) -> ApplyResult:
        self.committed_at[event.key] = time.time()
        return ApplyResult(ApplyOutcome.APPLIED, event.version)


class BundlingStoreAgent(StoreAgent):
    """Group commit: the calls that arrive while a bundle commits form the next one."""

    def __init__(self, store: ObjectStore, max_bundle: int = 256) -> None:
        super().__init__(store)
        self._queue: list[tuple[ChangeEvent, asyncio.Future[ApplyResult]]] = []
        self._busy = False
        self._max = max_bundle

    async def _apply(self, event: ChangeEvent) -> ApplyResult:
        future: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        self._queue.append((event, future))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                items = [
                    (e.dataset, e.key, e.version, None if e.version.is_tombstone else [e.inline])
                    for e, _ in batch
                ]
                try:
                    results = await asyncio.to_thread(self.store.apply_many, items)  # type: ignore[arg-type]
                except Exception as exc:  # noqa: BLE001 - handed to every caller of the bundle
                    for _, f in batch:
                        f.set_exception(exc)
                    continue
                now = time.time()
                for (e, f), r in zip(batch, results, strict=True):
                    self.committed_at[e.key] = now
                    f.set_result(ApplyResult(_OUTCOMES[r.verdict], r.newest))
        finally:
            self._busy = False


def policy() -> CompiledPolicy:
    from datetime import UTC, datetime

    placement = Placement(
        dataset=DATASET,
        policy="bench",
        dataset_class="standard",
        home="eu-west",
        replicas=(REGION,),
        residency=("EU",),
        rpo_s=30.0,
        failover_mode="manual",
        failover_order=(),
    )
    return CompiledPolicy(
        digest="bench",
        revision=1,
        applied_at=datetime.now(UTC),
        regions={"eu-west": "EU", REGION: "EU"},
        links={},
        placements={DATASET: placement},
        rules={},
    )


def event(i: int, size: int, wall_ms: int | None = None) -> ChangeEvent:
    data = os.urandom(size)
    hlc = HLC(wall_ms if wall_ms is not None else system_ms(), i % 90_000, "eu-west")
    return ChangeEvent(
        event_id=f"bench-{uuid.uuid4().hex}",
        dataset=DATASET,
        key=f"obj-{i:07d}",
        version=Version.put(hlc, size, Digest.of(data)),
        origin_region="eu-west",
        policy_revision=1,
        inline=data,
    )


async def publish(kafka: str, topic: str, events: Sequence[ChangeEvent]) -> None:
    async with KafkaProducer(kafka, linger_ms=5) as producer:
        values = [(e.log_key.encode(), encode_change_event(e)) for e in events]
        for start in range(0, len(values), 2000):
            await producer.send_many(topic, values[start : start + 2000])


async def run_replicator(
    kafka: str, topic: str, agent: StoreAgent, count: int, folder: Path
) -> float:
    config = ReplicatorConfig(region=REGION, max_in_flight=512, commit_interval_s=0.05)
    metrics = ReplicatorMetrics(REGION)
    journal = RecordJournal(folder / f"journal-{uuid.uuid4().hex}.db")
    snapshot = policy()

    async def no_letters(record: Record, reason: str, detail: str) -> None:
        raise RuntimeError(f"dead letter in a benchmark: {reason}: {detail}")

    class Letters:
        send = staticmethod(no_letters)

    applier = Applier(
        config,
        agent=agent,
        journal=journal,
        dead_letters=Letters(),
        policy=lambda: snapshot,
        metrics=metrics,
        clock=HybridClock(REGION, max_clock_skew_ms=10**9),
    )
    consumer = KafkaConsumer(kafka, topics=[topic], group_id=f"bench-{uuid.uuid4().hex}")
    loop = ReplicatorLoop(
        config,
        consumer,
        applier,
        metrics,
        assigned_by_rebalance=False,
        before_commit=lambda: asyncio.to_thread(journal.flush),
    )
    async with consumer:
        started = time.perf_counter()
        async with loop:
            await loop.wait_handled(count, 3600)
            await loop.commit()
        elapsed = time.perf_counter() - started
    journal.close()
    return elapsed


async def bare_loop(kafka: str, topic: str, count: int, folder: Path, *, sync: bool) -> float:
    """aiokafka consume → write each value to its own file (with fsync if `sync`) → commit."""
    out = folder / f"bare-{uuid.uuid4().hex}"
    out.mkdir()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka,
        group_id=f"bare-{uuid.uuid4().hex}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    done = 0
    try:
        started = time.perf_counter()
        while done < count:
            batches = await consumer.getmany(timeout_ms=200, max_records=2000)

            def write(batches: dict[TopicPartition, list[object]]) -> int:
                n = 0
                for msgs in batches.values():
                    for m in msgs:
                        path = out / f"{m.partition}-{m.offset}"  # type: ignore[attr-defined]
                        with open(path, "wb") as fh:
                            fh.write(m.value)  # type: ignore[attr-defined]
                            if sync:
                                fh.flush()
                                os.fsync(fh.fileno())
                        n += 1
                return n

            done += await asyncio.to_thread(write, batches)
            if batches:
                await consumer.commit()
        return time.perf_counter() - started
    finally:
        await consumer.stop()


async def lag_run(
    kafka: str, rate: int, seconds: int, folder: Path, make: type[StoreAgent]
) -> list[float]:
    topic = f"bench.lag.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(kafka) as admin:
        await admin.ensure_topics([TopicSpec(topic, partitions=12)])
    with ObjectStore(
        folder / "lag-store", clock=HybridClock(REGION, max_clock_skew_ms=10**9)
    ) as store:
        agent = make(store)
        total = rate * seconds
        sent_at: dict[str, float] = {}
        config = ReplicatorConfig(region=REGION, max_in_flight=512, commit_interval_s=0.05)
        metrics = ReplicatorMetrics(REGION)
        journal = RecordJournal(folder / f"lag-{uuid.uuid4().hex}.db")
        snapshot = policy()

        class Letters:
            async def send(self, record: Record, reason: str, detail: str) -> None:
                raise RuntimeError(reason)

        applier = Applier(
            config,
            agent=agent,
            journal=journal,
            dead_letters=Letters(),
            policy=lambda: snapshot,
            metrics=metrics,
            clock=HybridClock(REGION, max_clock_skew_ms=10**9),
        )
        consumer = KafkaConsumer(kafka, topics=[topic], group_id=f"lag-{uuid.uuid4().hex}")
        loop = ReplicatorLoop(
            config,
            consumer,
            applier,
            metrics,
            assigned_by_rebalance=False,
            before_commit=lambda: asyncio.to_thread(journal.flush),
        )
        async with consumer, loop, KafkaProducer(kafka, linger_ms=1) as producer:
            tick = 0.01
            per_tick = max(1, int(rate * tick))
            start = time.perf_counter()
            i = 0
            while i < total:
                batch = [event(i + j, KiB) for j in range(min(per_tick, total - i))]
                futures = [
                    await producer._producer.send(
                        topic, value=encode_change_event(e), key=e.log_key.encode()
                    )
                    for e in batch
                ]
                for e, f in zip(batch, futures, strict=True):
                    await f
                    sent_at[e.key] = e.version.hlc.wall_ms / 1000
                i += len(batch)
                delay = start + (i / rate) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await loop.wait_handled(total, 3600)
        journal.close()
        return [agent.committed_at[k] - t for k, t in sent_at.items()]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    kafka = os.environ.get("MERIDIAN_KAFKA", "127.0.0.1:9092")
    topic = f"bench.apply.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(kafka) as admin:
        await admin.ensure_topics([TopicSpec(topic, partitions=12)])
    base = system_ms() - 60_000
    events = [event(i, KiB, base) for i in range(args.objects)]
    await publish(kafka, topic, events)
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="repl-bench-") as tmp:
        folder = Path(tmp)
        bare = await bare_loop(kafka, topic, args.objects, folder, sync=True)
        rows.append(("bare aiokafka → file+fsync → commit", bare))
        unsynced = await bare_loop(kafka, topic, args.objects, folder, sync=False)
        rows.append(("bare aiokafka → file (no fsync) → commit", unsynced))
        for name, make in (
            ("replicator, null agent (its own ceiling)", NullAgent),
            ("replicator, store.apply per event", StoreAgent),
            ("replicator, store group commit", BundlingStoreAgent),
        ):
            root = folder / name.replace(" ", "_").replace(",", "")
            with ObjectStore(root, clock=HybridClock(REGION, max_clock_skew_ms=10**9)) as store:
                rows.append(
                    (name, await run_replicator(kafka, topic, make(store), args.objects, folder))
                )
        lags = {
            name: await lag_run(kafka, args.rate, args.seconds, folder, make)
            for name, make in (
                ("null agent", NullAgent),
                ("store group commit", BundlingStoreAgent),
            )
        }
    print(f"\napply throughput, {args.objects} objects of 1 KiB into {REGION} (one run)\n")
    print(f"| {'loop':<40} | {'seconds':>8} | {'objects/s':>10} | {'vs bare':>7} |")
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 12}|{'-' * 9}|")
    for name, secs in rows:
        print(f"| {name:<40} | {secs:8.2f} | {args.objects / secs:10.0f} | {bare / secs:7.2f} |")
    print(f"\nend-to-end lag at {args.rate} writes/s of 1 KiB for {args.seconds} s")
    print("(Kafka ack of the publish → the agent's commit answered)\n")
    print(f"| {'agent':<20} | {'p50 ms':>8} | {'p99 ms':>8} | {'max ms':>8} |")
    print(f"|{'-' * 22}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    for name, values in lags.items():
        print(
            f"| {name:<20} | {pct(values, 50) * 1000:8.0f} | {pct(values, 99) * 1000:8.0f} "
            f"| {max(values) * 1000:8.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
