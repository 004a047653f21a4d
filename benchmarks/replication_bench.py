"""Replication benchmark (issue 12): the replicator's apply path on the local stack, one run.

    meridian stack up
    python benchmarks/replication_bench.py [--objects 20000] [--partition-s 60]

Everything runs against the stack's real Kafka, etcd and Toxiproxy, with real
`meridian agent serve` processes (eu-west, the origin; eu-central, the region
applied into). The replicator is the code `meridian replicator run` runs
(`ReplicatorLoop` + `Applier` + `GrpcAgent`), in this process, with its own consumer
group on a fresh topic; its catalog duties (shipper, backlog probe) are left out.
Printed, in one table with the issue's targets:

1. apply throughput of 1 KiB inline objects into eu-central: N change events
   published beforehand, timed from the loop's start to the last event's effect
   (the agent's `ReplicateMany` commit answered). Beside it, on the same topic in the
   same run, the bare loop the issue names, aiokafka consume → write each value to
   its own local file → commit: once with one fsync per message, and `--bare-runs`
   times (3) with one syncfs per poll batch (what the agent's batch apply of files
   did: the fair comparison; the ratio the target is checked against is to the
   fastest of those runs, whose rate swings 2x with the shared disk's noise);
2. end-to-end lag at a steady 1,000 writes/s of 1 KiB: the Kafka ack of the publish
   (standing for the origin's ack: the outbox drain publishes right after the
   commit) → the agent's commit answered in eu-central; p50, p99, max;
3. drain after a partition: the replicator reads Kafka through the stack's WAN
   proxy; the proxy is disabled for `--partition-s` seconds while 500 writes/s go
   on, then enabled; the time from the heal until every event is applied;
4. objects of 1 MiB and 64 MiB (not inline): stored in eu-west, their events name
   the eu-west agent, eu-central's agent fetches them with `Sync`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import bench_harness  # noqa: F401 - puts tests/ (the process harness) on the path
import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from harness.agent_process import AgentProcess, prepare_world

from agents.client import AgentClient
from agents.store import files
from controlplane.adapters.kafka import KafkaAdmin, KafkaConsumer, KafkaProducer
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.version import Digest, Version
from controlplane.logs import configure_logging
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Record, TopicSpec
from controlplane.settings import Settings, load_settings
from controlplane.stack.kafka import wan_proxy_port
from controlplane.stack.manager import KAFKA_WAN_PROXY
from meridian.convert import encode_change_event
from replicator.agent_grpc import GrpcAgent
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.ports import AgentPort, ApplyOutcome, ApplyResult, Source
from replicator.service import ReplicatorLoop

KiB, MiB = 1024, 1024 * 1024
ORIGIN, REGION = "eu-west", "eu-central"
DATASET = "corpus/bench"  # standard, copies anywhere (the harness's world policy)
PARTITIONS = 12


class StampedConsumer(KafkaConsumer):
    """The replicator's consumer, noting when each record's poll returned it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.polled_at: dict[bytes, float] = {}  # record key -> time.time() of its poll

    async def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        records = await super().poll(max_records, timeout_ms)
        now = time.time()
        for r in records:
            if r.key is not None:
                self.polled_at.setdefault(r.key, now)
        return records


class Timed:
    """An `AgentPort` that notes when each event's apply was answered (its commit), and
    when its call to the agent started."""

    def __init__(self, inner: AgentPort) -> None:
        self.inner = inner
        self.done_at: dict[str, float] = {}  # event key -> time.time() of its first effect
        self.called_at: dict[str, float] = {}  # event key -> time.time() its call started
        self.batch_calls: list[tuple[int, float]] = []  # (events, seconds) of each call
        self.fetch_s: list[float] = []  # how long each fetch call took
        self.fetch_spans: list[tuple[float, float]] = []  # each fetch call's (start, end)
        self._noted = asyncio.Event()

    def _note(self, events: Sequence[ChangeEvent]) -> None:
        now = time.time()
        for e in events:
            # The first answer: a redelivery after a rebalance answers `same` later.
            self.done_at.setdefault(e.key, now)
        self._noted.set()

    async def wait_all(self, keys: set[str], timeout_s: float) -> None:
        """Until every one of `keys` has had its effect. Not the loop's count of handled
        events: that counts a redelivered event again (a partition's rejoin replays what
        was not committed), and so ended the drain before every event was applied."""
        async with asyncio.timeout(timeout_s):
            while not keys <= self.done_at.keys():
                self._noted.clear()
                await self._noted.wait()

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        r = await self.inner.apply_inline(event)
        self._note([event])
        return r

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        r = await self.inner.delete(event)
        self._note([event])
        return r

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        started = time.perf_counter()
        r = await self.inner.fetch(event, sources)
        ended = time.perf_counter()
        self.fetch_s.append(ended - started)
        self.fetch_spans.append((started, ended))
        if r.outcome is not ApplyOutcome.APPLIED:
            raise RuntimeError(f"a benchmark fetch of {event.key} was {r.outcome.value}")
        self._note([event])
        return r

    async def apply_many(self, events: Sequence[ChangeEvent]) -> list[ApplyResult | Exception]:
        now = time.time()
        for e in events:
            self.called_at.setdefault(e.key, now)
        r = await self.inner.apply_many(events)
        self.batch_calls.append((len(events), time.time() - now))
        self._note(events)
        return r

    async def head(self, dataset: str, key: str) -> Version | None:
        return await self.inner.head(dataset, key)


class NullAgent:
    """Applies nothing (answers APPLIED at once): the replicator's own ceiling."""

    async def _ok(self, event: ChangeEvent) -> ApplyResult:
        return ApplyResult(ApplyOutcome.APPLIED, event.version)

    apply_inline = delete = _ok

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        return await self._ok(event)

    async def apply_many(self, events: Sequence[ChangeEvent]) -> list[ApplyResult | Exception]:
        return [ApplyResult(ApplyOutcome.APPLIED, e.version) for e in events]

    async def head(self, dataset: str, key: str) -> Version | None:
        return None


def event(n: int, data: bytes, tag: str, wall_ms: int | None = None) -> ChangeEvent:
    hlc = HLC(wall_ms if wall_ms is not None else system_ms(), n % 90_000, ORIGIN)
    return ChangeEvent(
        event_id=f"bench-{uuid.uuid4().hex}",
        dataset=DATASET,
        key=f"{tag}/obj-{n:07d}",
        version=Version.put(hlc, len(data), Digest.of(data)),
        origin_region=ORIGIN,
        policy_revision=1,
        inline=data,
    )


async def new_topic(kafka: str, name: str) -> str:
    topic = f"bench.{name}.{uuid.uuid4().hex[:8]}"
    async with KafkaAdmin(kafka) as admin:
        await admin.ensure_topics([TopicSpec(topic, partitions=PARTITIONS)])
    return topic


async def publish(kafka: str, topic: str, events: Sequence[ChangeEvent]) -> None:
    async with KafkaProducer(kafka, linger_ms=5) as producer:
        values = [(e.log_key.encode(), encode_change_event(e)) for e in events]
        for start in range(0, len(values), 2000):
            await producer.send_many(topic, values[start : start + 2000])


class Replicator:
    """The replicator's loop over one agent port, consuming `topic` with a fresh group."""

    def __init__(self, kafka: str, topic: str, agent: AgentPort, folder: Path) -> None:
        self.config = ReplicatorConfig(region=REGION, max_in_flight=64, commit_interval_s=0.05)
        self.journal = RecordJournal(folder / f"journal-{uuid.uuid4().hex}.db")
        self.metrics = ReplicatorMetrics(REGION)
        self.consumer = StampedConsumer(kafka, topics=[topic], group_id=f"bench-{uuid.uuid4().hex}")
        snapshot: list[CompiledPolicy] = []

        class Letters:
            async def send(self, record: Record, reason: str, detail: str) -> None:
                raise RuntimeError(f"dead letter in a benchmark: {reason}: {detail}")

        self.applier = Applier(
            self.config,
            agent=agent,
            journal=self.journal,
            dead_letters=Letters(),
            policy=lambda: snapshot[0],
            metrics=self.metrics,
            clock=HybridClock(REGION, max_clock_skew_ms=10**9),
        )
        self.snapshot = snapshot
        self.loop = ReplicatorLoop(
            self.config,
            self.consumer,
            self.applier,
            self.metrics,
            assigned_by_rebalance=False,
            before_commit=lambda: asyncio.to_thread(self.journal.flush),
        )

    async def run(
        self, policy: CompiledPolicy, body: Callable[[ReplicatorLoop], Awaitable[None]]
    ) -> None:
        self.snapshot.append(policy)
        try:
            async with self.consumer, self.loop:
                await body(self.loop)
        finally:
            self.journal.close()


async def timed_apply(
    kafka: str, topic: str, agent: AgentPort, count: int, folder: Path, policy: CompiledPolicy
) -> float:
    rep = Replicator(kafka, topic, agent, folder)
    elapsed = [0.0]

    async def body(loop: ReplicatorLoop) -> None:
        # From the first event's effect: the group join before it is no part of the rate.
        await loop.wait_handled(1, 120)
        started = time.perf_counter()
        await loop.wait_handled(count, 3600)
        elapsed[0] = time.perf_counter() - started

    await rep.run(policy, body)
    return elapsed[0]


async def bare_loop(
    kafka: str, topic: str, count: int, folder: Path, *, per_message: bool
) -> float:
    """aiokafka consume → write each value to its own file → commit; durable by one fsync
    per message (`per_message`) or one syncfs per poll batch, before the commit."""
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
            batches = await consumer.getmany(timeout_ms=200, max_records=500)
            if done == 0:
                started = time.perf_counter()  # from the first records, as the replicator

            def write(batches: dict[TopicPartition, list[object]]) -> int:
                n = 0
                for msgs in batches.values():
                    for m in msgs:
                        path = out / f"{m.partition}-{m.offset}"  # type: ignore[attr-defined]
                        with open(path, "wb") as fh:
                            fh.write(m.value)  # type: ignore[attr-defined]
                            if per_message:
                                fh.flush()
                                os.fsync(fh.fileno())
                        n += 1
                if n and not per_message:
                    files.syncfs(out)
                return n

            done += await asyncio.to_thread(write, batches)
            if batches:
                await consumer.commit()
        return time.perf_counter() - started
    finally:
        await consumer.stop()


async def paced(
    producer: KafkaProducer,
    topic: str,
    rate: int,
    seconds: float,
    tag: str,
    sent: dict[str, float],
    queued: dict[str, float] | None = None,
) -> int:
    """Publish 1 KiB events at `rate`/s for `seconds`; note each one's Kafka ack time (and
    in `queued`, when its send began)."""
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    total = int(rate * seconds)
    start = time.perf_counter()
    i = 0
    while i < total:
        batch = [event(i + j, os.urandom(KiB), tag) for j in range(min(per_tick, total - i))]
        if queued is not None:
            began = time.time()
            for e in batch:
                queued[e.key] = began
        acks = await producer.send_many(
            topic, [(e.log_key.encode(), encode_change_event(e)) for e in batch]
        )
        del acks
        now = time.time()
        for e in batch:
            sent[e.key] = now
        i += len(batch)
        delay = start + (i / rate) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    return total


STAGES = ("send → Kafka ack", "Kafka ack → polled", "polled → agent call", "agent call → commit")


async def lag_run(
    kafka: str, agent: AgentPort, rate: int, seconds: int, folder: Path, policy: CompiledPolicy
) -> tuple[list[float], dict[str, list[float]]]:
    """Each event's lag (its Kafka ack → its commit answered in eu-central), and the
    seconds each event spent in each of `STAGES` (keyed by stage)."""
    topic = await new_topic(kafka, "lag")
    timed = Timed(agent)
    rep = Replicator(kafka, topic, timed, folder)
    sent: dict[str, float] = {}
    queued: dict[str, float] = {}

    async def body(loop: ReplicatorLoop) -> None:
        async with KafkaProducer(kafka, linger_ms=1) as producer:
            await paced(producer, topic, rate, seconds, "lag", sent, queued)
        await timed.wait_all(set(sent), 600)

    await rep.run(policy, body)
    calls = timed.batch_calls
    if calls:
        mean = sum(n for n, _ in calls) / len(calls)
        print(
            f"lag run: {len(calls)} batch calls, {mean:.1f} events each on average, "
            f"p50 {pct([t for _, t in calls], 50) * 1000:.0f} ms",
            file=sys.stderr,
        )
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    polled = rep.consumer.polled_at
    for k, acked in sent.items():
        got = polled.get(f"{DATASET}/{k}".encode())
        called = timed.called_at.get(k)
        if got is None or called is None:
            continue  # applied one by one (not in a batch call): no stage marks
        marks = (queued[k], acked, got, called, timed.done_at[k])
        for name, a, b in zip(STAGES, marks, marks[1:], strict=False):
            stages[name].append(b - a)
    return [timed.done_at[k] - t for k, t in sent.items()], stages


async def partition_run(
    kafka: str,
    wan_kafka: str,
    faults: ToxiproxyClient,
    agent: AgentPort,
    rate: int,
    cut_s: float,
    folder: Path,
    policy: CompiledPolicy,
) -> tuple[float, int, float, int]:
    """Seconds from the heal until every event is applied, the events sent, the
    seconds from the heal until the first event sent during the cut was applied (the
    consumer's way back: reconnect, rejoin, fetch; the rest is the apply rate), and
    the events sent during the cut."""
    topic = await new_topic(kafka, "partition")
    timed = Timed(agent)
    rep = Replicator(wan_kafka, topic, timed, folder)
    sent: dict[str, float] = {}
    drain = [0.0, 0.0, 0.0, 0.0]

    async def body(loop: ReplicatorLoop) -> None:
        async with KafkaProducer(kafka, linger_ms=1) as producer:
            warm = await paced(producer, topic, rate, 2, "warm", sent)
            await timed.wait_all(set(sent), 120)
            faults.disable(KAFKA_WAN_PROXY)
            try:
                during = await paced(producer, topic, rate, cut_s, "cut", sent)
            finally:
                faults.enable(KAFKA_WAN_PROXY)
            healed, healed_wall = time.perf_counter(), time.time()
            await timed.wait_all(set(sent), 600)
            drain[0] = time.perf_counter() - healed
            drain[1] = warm + during
            cut = [at for k, at in timed.done_at.items() if k.startswith("cut/")]
            drain[2] = min(cut) - healed_wall if cut else 0.0
            drain[3] = len(cut)

    await rep.run(policy, body)
    return drain[0], int(drain[1]), drain[2], int(drain[3])


async def large_run(
    kafka: str,
    west: AgentClient,
    agent: AgentPort,
    west_address: str,
    size: int,
    count: int,
    folder: Path,
    policy: CompiledPolicy,
) -> tuple[float, float]:
    """Objects of `size` stored in eu-west, fetched into eu-central: the mean seconds of
    one fetch call (the agent's Sync pull from eu-west and its commit), and the seconds
    from the first call's start to the last one's end (the replicator runs a few at
    once, so the mean call is not the rate)."""
    topic = await new_topic(kafka, f"large{size // MiB}")
    tag = f"large-{size // MiB}m-{uuid.uuid4().hex[:6]}"
    events = []
    for n in range(count):
        data = os.urandom(size)

        async def chunks(data: bytes = data) -> AsyncIterator[bytes]:
            for at in range(0, len(data), MiB):
                yield data[at : at + MiB]

        version = await west.put(DATASET, f"{tag}/obj-{n}", chunks(), size=size)
        events.append(
            ChangeEvent(
                event_id=f"bench-{uuid.uuid4().hex}",
                dataset=DATASET,
                key=f"{tag}/obj-{n}",
                version=version,
                origin_region=ORIGIN,
                policy_revision=policy.revision,
                origin_agent=west_address,
            )
        )
    await publish(kafka, topic, events)
    timed = Timed(agent)
    await timed_apply(kafka, topic, timed, count, folder, policy)
    wall = max(e for _, e in timed.fetch_spans) - min(s for s, _ in timed.fetch_spans)
    return sum(timed.fetch_s) / len(timed.fetch_s), wall


@contextlib.contextmanager
def profiled(pids: dict[str, int]) -> Iterator[None]:
    """With MERIDIAN_BENCH_PYSPY=DIR (and py-spy installed): sample each named process
    while the block runs, into DIR/NAME.txt (py-spy's collapsed stacks, one per line
    with its count), to see where the CPU per object goes. Off by default.
    MERIDIAN_BENCH_PYSPY_FLAGS replaces the sampling flags `--nonblocking --gil`
    (only the thread holding the GIL: the Python CPU), e.g. with `--native --threads`
    to see every thread's C frames too (SQLite, syscalls, gRPC's core; py-spy then
    pauses the process at each sample, so the run is slower)."""
    out = os.environ.get("MERIDIAN_BENCH_PYSPY")
    if not out:
        yield
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--rate",
                "200",
                "--format",
                "raw",
                *os.environ.get("MERIDIAN_BENCH_PYSPY_FLAGS", "--nonblocking --gil").split(),
                "--output",
                str(Path(out) / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            spy.wait(timeout=60)


async def recorder_caught_up(metrics_address: str, timeout_s: float) -> float:
    """Seconds until the agent's recorder has shipped its whole journal to the catalog
    (its `meridian_records_behind_seconds` reads 0), scraped every 0.2 s."""
    started = time.perf_counter()
    async with httpx.AsyncClient() as http, asyncio.timeout(timeout_s):
        while True:
            text = (await http.get(f"http://{metrics_address}/metrics")).text
            behind = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("meridian_records_behind_seconds")
            ]
            if behind and max(behind) == 0:
                return time.perf_counter() - started
            await asyncio.sleep(0.2)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU seconds in user mode and in the kernel a process has used so far: the
    kernel's share is mostly the store's file creates, renames and syncs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def current_policy(settings: Settings) -> CompiledPolicy:
    from controlplane.adapters.etcd import EtcdCoordination
    from controlplane.policy.current import PolicyView

    coord = EtcdCoordination([f"{h}:{p}" for h, p in settings.etcd_endpoints])
    await coord.connect()
    try:
        async with PolicyView(coord) as view:
            for _ in range(100):
                try:
                    return view.require()
                except Exception:  # noqa: BLE001 - not loaded yet
                    await asyncio.sleep(0.1)
            return view.require()
    finally:
        await coord.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument(
        "--bare-runs", type=int, default=3, help="runs of the bare loop; the best is compared"
    )
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--partition-rate", type=int, default=500)
    parser.add_argument("--partition-s", type=float, default=60.0)
    parser.add_argument("--large", default="1:20,64:2", help="MiB:count,... of fetched objects")
    parser.add_argument(
        "--only-lag", action="store_true", help="the lag rows only, with each stage's share"
    )
    parser.add_argument(
        "--only-throughput", action="store_true", help="the throughput and CPU rows only"
    )
    parser.add_argument(
        "--only-large", action="store_true", help="the fetched (1 MiB, 64 MiB) rows only"
    )
    parser.add_argument(
        "--only-drain", action="store_true", help="the drain after a partition rows only"
    )
    args = parser.parse_args()
    # As `meridian replicator run` logs (one JSON line per event on stderr, which the
    # chaos suite reads): redirect stderr to keep the table readable.
    configure_logging("info", json=True)
    base = load_settings()  # the stack's ports (MERIDIAN_STACK_*_PORT), as the tests use
    settings = load_settings(
        etcd=f"127.0.0.1:{base.stack_etcd_port}",
        kafka=f"127.0.0.1:{base.stack_kafka_port}",
        toxiproxy=f"127.0.0.1:{base.stack_toxiproxy_port}",
    )
    kafka = settings.kafka
    etcd = settings.etcd
    wan_kafka = f"127.0.0.1:{wan_proxy_port(settings)}"
    faults = ToxiproxyClient(f"http://{settings.toxiproxy}")
    with tempfile.TemporaryDirectory(prefix="repl-bench-") as tmp:
        folder = Path(tmp)
        env = prepare_world(folder / "world", etcd, kafka=kafka)
        agents = {
            r: AgentProcess(r, folder / r, env, folder / f"{r}.log", metrics=r == REGION)
            for r in (ORIGIN, REGION)
        }
        for a in agents.values():
            a.start(timeout_s=60)
        try:
            policy = await current_policy(settings)
            return await measure(args, kafka, wan_kafka, faults, agents, folder, policy)
        finally:
            for a in agents.values():
                a.stop()


def header() -> None:
    print(f"| {'measure':<58} | {'result':>16} | {'target':>22} | ok |")
    print(f"|{'-' * 60}|{'-' * 18}|{'-' * 24}|----|")


def row(name: str, result: str, target: str, ok: bool | None) -> None:
    mark = "" if ok is None else ("yes" if ok else "NO")
    print(f"| {name:<58} | {result:>16} | {target:>22} | {mark:>2} |")


def lag_rows(args: argparse.Namespace, lags: list[float], stages: dict[str, list[float]]) -> None:
    p50, p99 = pct(lags, 50) * 1000, pct(lags, 99) * 1000
    row(
        f"lag at {args.rate}/s for {args.seconds} s, p50 (Kafka ack → commit)",
        f"{p50:,.0f} ms",
        "≤ 100 ms",
        p50 <= 100,
    )
    row(f"lag at {args.rate}/s, p99", f"{p99:,.0f} ms", "≤ 1,000 ms", p99 <= 1000)
    row(f"lag at {args.rate}/s, max", f"{max(lags) * 1000:,.0f} ms", "", None)
    for name, spent in stages.items():
        if spent:
            row(
                f"  stage {name}, p50 / p99",
                f"{pct(spent, 50) * 1000:,.0f} / {pct(spent, 99) * 1000:,.0f} ms",
                "",
                None,
            )


async def measure(
    args: argparse.Namespace,
    kafka: str,
    wan_kafka: str,
    faults: ToxiproxyClient,
    agents: dict[str, AgentProcess],
    folder: Path,
    policy: CompiledPolicy,
) -> int:
    if args.only_lag:
        async with GrpcAgent(agents[REGION].address) as agent:
            lags, stages = await lag_run(kafka, agent, args.rate, args.seconds, folder, policy)
        print(f"\nreplication benchmark: lag at {args.rate}/s into {REGION}, one run\n")
        header()
        lag_rows(args, lags, stages)
        return 0
    if args.only_drain:
        async with GrpcAgent(agents[REGION].address) as agent:
            drain, cut_events, back_s, during = await partition_run(
                kafka,
                wan_kafka,
                faults,
                agent,
                args.partition_rate,
                args.partition_s,
                folder,
                policy,
            )
        print(f"\nreplication benchmark: drain after a partition of {REGION}, one run\n")
        header()
        drain_table(args, drain, cut_events, back_s, during)
        return 0
    if args.only_large:
        async with (
            GrpcAgent(agents[REGION].address) as agent,
            AgentClient(agents[ORIGIN].address) as west,
        ):
            fetched = await large_rows(args, kafka, west, agent, agents, folder, policy)
        print(f"\nreplication benchmark: fetched objects into {REGION}, one run\n")
        header()
        large_table(fetched)
        return 0
    topic = await new_topic(kafka, "apply")
    base = system_ms() - 60_000
    await publish(
        kafka, topic, [event(i, os.urandom(KiB), "tput", base) for i in range(args.objects)]
    )
    n = args.objects
    bare_msg = await bare_loop(kafka, topic, n, folder, per_message=True)
    # The bare loop's rate swung 2x between runs of a minute (its file creates cost
    # what the shared disk's other users leave): the best of `--bare-runs`, rate and
    # CPU of that run, is what the ratio is checked against. The fastest bare loop
    # is the hardest comparison for the replicator, so the best-of cannot flatter it.
    bare_runs: list[tuple[float, float]] = []  # (seconds, CPU seconds) of each run
    for _ in range(args.bare_runs):
        mine = time.process_time()
        took = await bare_loop(kafka, topic, n, folder, per_message=False)
        bare_runs.append((took, time.process_time() - mine))
    bare_batch, bare_cpu = min(bare_runs)
    mine = time.process_time()
    null = await timed_apply(kafka, topic, NullAgent(), n, folder, policy)
    null_cpu = time.process_time() - mine
    async with (
        GrpcAgent(agents[REGION].address) as agent,
        AgentClient(agents[ORIGIN].address) as west,
    ):
        pid = agents[REGION].pid
        split_before = cpu_split(pid)
        agent_before, mine = sum(split_before), time.process_time()
        with profiled({"agent": pid, "replicator": os.getpid()}):
            real = await timed_apply(kafka, topic, agent, n, folder, policy)
        # Where each object's CPU goes (2 cores, shared): the agent (gRPC, store, and its
        # recorder shipping the journal to the catalog meanwhile) and this process (the
        # replicator's loop). Both include what ran while the consumer group formed.
        agent_cpu, repl_cpu = cpu_s(pid) - agent_before, time.process_time() - mine
        agent_user, agent_sys = (b - a for a, b in zip(split_before, cpu_split(pid), strict=True))
        # The recorder ships the journal behind the applies: its leftover for these
        # objects is part of what each one costs the agent.
        shipped_s = await recorder_caught_up(agents[REGION].metrics_address, 300)
        shipped_cpu = cpu_s(pid) - agent_before
        print(
            f"real agent: {n / real:,.0f}/s; null: {n / null:,.0f}/s; the recorder caught up "
            f"{shipped_s:.1f} s after the last apply",
            file=sys.stderr,
        )
        lags: list[float] = []
        stages: dict[str, list[float]] = {}
        drain, cut_events, back_s, during = 0.0, 0, 0.0, 0
        large: list[tuple[int, int, float, float]] = []
        if not args.only_throughput:
            lags, stages = await lag_run(kafka, agent, args.rate, args.seconds, folder, policy)
            drain, cut_events, back_s, during = await partition_run(
                kafka,
                wan_kafka,
                faults,
                agent,
                args.partition_rate,
                args.partition_s,
                folder,
                policy,
            )
        if not args.only_throughput:
            large = await large_rows(args, kafka, west, agent, agents, folder, policy)
    rate = n / real
    print(f"\nreplication benchmark: {n} objects of 1 KiB into {REGION}, one run\n")
    header()

    row("bare aiokafka → file, fsync per message → commit", f"{n / bare_msg:,.0f}/s", "", None)
    row(
        f"bare aiokafka → file, one syncfs per poll batch → commit, best of {len(bare_runs)}",
        f"{n / bare_batch:,.0f}/s",
        "",
        None,
    )
    if len(bare_runs) > 1:
        row(
            "  each run, objects/s",
            " / ".join(f"{n / took:,.0f}" for took, _ in bare_runs),
            "",
            None,
        )
    row("replicator, agent that does nothing (its ceiling)", f"{n / null:,.0f}/s", "", None)
    us = 1e6 / n
    row(
        "  CPU per object: bare loop with syncfs (its best run) / replicator alone",
        f"{bare_cpu * us:,.0f} / {null_cpu * us:,.0f} µs",
        "",
        None,
    )
    row(
        "replicator → real agent (ReplicateMany), objects/s",
        f"{rate:,.0f}/s",
        "≥ 5,000/s",
        rate >= 5000,
    )
    ratio = bare_batch / real
    row("  vs bare loop with syncfs per batch", f"{ratio:.2f}×", "≥ 0.5×", ratio >= 0.5)
    row("  vs bare loop with fsync per message", f"{bare_msg / real:.2f}×", "", None)
    row(
        "  CPU per object: agent (incl. its recorder) / replicator",
        f"{agent_cpu * us:,.0f} / {repl_cpu * us:,.0f} µs",
        "",
        None,
    )
    row(
        "  of the agent's: user / kernel",
        f"{agent_user * us:,.0f} / {agent_sys * us:,.0f} µs",
        "",
        None,
    )
    row(
        "  CPU per object: agent, once its recorder has shipped them",
        f"{shipped_cpu * us:,.0f} µs",
        "",
        None,
    )
    if args.only_throughput:
        return 0
    lag_rows(args, lags, stages)
    drain_table(args, drain, cut_events, back_s, during)
    large_table(large)
    return 0


def drain_table(
    args: argparse.Namespace, drain: float, cut_events: int, back_s: float, during: int
) -> None:
    row(
        f"drain after a {args.partition_s:g} s partition at {args.partition_rate}/s "
        f"({cut_events} events)",
        f"{drain:.1f} s",
        "≤ 30 s",
        drain <= 30,
    )
    row("  heal → first event sent during the cut applied", f"{back_s:.1f} s", "", None)
    if drain > back_s:
        row(
            "  then the backlog's apply rate",
            f"{during / (drain - back_s):,.0f}/s",
            "",
            None,
        )


async def large_rows(
    args: argparse.Namespace,
    kafka: str,
    west: AgentClient,
    agent: AgentPort,
    agents: dict[str, AgentProcess],
    folder: Path,
    policy: CompiledPolicy,
) -> list[tuple[int, int, float, float]]:
    large: list[tuple[int, int, float, float]] = []
    for spec in args.large.split(","):
        mib, count = (int(x) for x in spec.split(":"))
        secs, wall = await large_run(
            kafka, west, agent, agents[ORIGIN].address, mib * MiB, count, folder, policy
        )
        large.append((mib, count, secs, wall))
    return large


def large_table(large: list[tuple[int, int, float, float]]) -> None:
    for mib, count, secs, wall in large:
        row(
            f"{count} objects of {mib} MiB fetched (Sync from eu-west), one call",
            f"{secs:.2f} s, {mib / secs:.0f} MiB/s",
            "",
            None,
        )
        row(
            "  all of them, first call's start → last one's end",
            f"{wall:.2f} s, {mib * count / wall:.0f} MiB/s",
            "",
            None,
        )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
