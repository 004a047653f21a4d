"""The replicator on the real Kafka and etcd, against a real store over real gRPC.

- a rebalance (a second replicator joins the group mid-stream) redelivers without a
  second effect, and every offset ends committed;
- a SIGKILL of a `meridian replicator run` process after the agent's commit and
  before the offset commit replays the event as a no-op;
- a poison event is dead-lettered with its original bytes and reason; the rest flows;
- a region outside the dataset's placement (us-east) never receives a byte.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import repl_builders as b
import waiting
from harness.controllers import run_cli
from harness.ports import free_port
from repl_agent import StandInAgent, serve
from repl_world import (
    ReplicatorProcess,
    beginning,
    group_committed,
    prepare_world,
    publish,
    published_revision,
    read_from,
)

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.kafka import CHANGES_TOPIC, DLQ_TOPIC, KafkaConsumer, KafkaProducer
from controlplane.domain.hlc import system_ms
from controlplane.policy.current import PolicyView
from replicator.agent_grpc import GrpcAgent
from replicator.applier import Applier
from replicator.config import ReplicatorConfig, group_id
from replicator.dlq import KafkaDeadLetters
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.service import ReplicatorLoop

pytestmark = pytest.mark.integration


@pytest.fixture
def world(tmp_path: Path, etcd_endpoint: str, kafka_bootstrap: str) -> dict[str, str]:
    return prepare_world(tmp_path / "world", etcd_endpoint, kafka_bootstrap)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[StandInAgent, str]]:
    stand_in = StandInAgent(tmp_path / "agent", "eu-central")
    server, address = await serve(stand_in)
    yield stand_in, address
    await server.stop(grace=None)
    stand_in.close()


def dataset() -> str:
    return f"corpus/t-{uuid.uuid4().hex[:10]}"


async def until(
    stand_in: StandInAgent, predicate: Callable[[], bool], timeout_s: float = 60
) -> None:
    """Until `predicate` holds of what the agent has committed (notified at each commit)."""
    await b.until(stand_in.changed, predicate, timeout_s)


class InProcessReplicator:
    """A ReplicatorLoop on a real Kafka consumer of the region's group, in this process."""

    def __init__(self, name: str, kafka: str, coord: EtcdCoordination, agent: str, folder: Path):
        self.config = ReplicatorConfig(region="eu-central", commit_interval_s=0.05)
        self.metrics = ReplicatorMetrics("eu-central")
        self.journal = RecordJournal(folder / f"journal-{name}.db")
        self.kafka, self.coord, self.agent_address, self.name = kafka, coord, agent, name
        self.assigned: list[set[tuple[str, int]]] = []
        self.got_partitions = asyncio.Event()

    async def __aenter__(self) -> InProcessReplicator:
        self.view = PolicyView(self.coord)
        await self.view.start()
        self.agent = GrpcAgent(self.agent_address)
        await self.agent.start()
        self.producer = KafkaProducer(self.kafka)
        await self.producer.start()
        applier = Applier(
            self.config,
            agent=self.agent,
            journal=self.journal,
            dead_letters=KafkaDeadLetters(self.producer, "eu-central"),
            policy=self.view.require,
            metrics=self.metrics,
        )
        outer = self

        class Relay:
            async def on_revoked(self, partitions: set[tuple[str, int]]) -> None:
                await outer.loop.on_revoked(partitions)

            async def on_assigned(self, partitions: set[tuple[str, int]]) -> None:
                outer.assigned.append(set(partitions))
                if partitions:
                    outer.got_partitions.set()
                await outer.loop.on_assigned(partitions)

        self.consumer = KafkaConsumer(
            self.kafka,
            topics=[CHANGES_TOPIC.name],
            group_id=group_id("eu-central"),
            client_id=f"test-{self.name}",
            rebalance=Relay(),
            session_timeout_ms=6000,
        )
        journal = self.journal

        async def flush() -> None:
            journal.flush()

        self.loop = ReplicatorLoop(
            self.config, self.consumer, applier, self.metrics, before_commit=flush
        )
        await self.consumer.start()
        await self.loop.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.loop.stop()
        await self.consumer.stop()
        await self.producer.stop()
        await self.agent.stop()
        await self.view.stop()
        self.journal.close()


async def test_a_rebalance_redelivers_without_a_second_effect(
    world: dict[str, str],
    kafka_bootstrap: str,
    etcd_endpoint: str,
    agent: tuple[StandInAgent, str],
    tmp_path: Path,
) -> None:
    stand_in, address = agent
    ds = dataset()
    t = system_ms() - 60_000
    events = [
        b.put(f"k{i % 30:02d}", f"v{i}".encode(), wall_ms=t + i, dataset=ds) for i in range(300)
    ]
    newest = {e.key: e for e in events}

    joined = asyncio.Event()

    async def paced() -> None:  # a stream long enough for the second member to join mid-way
        for start in range(0, len(events), 20):
            if start == 160:
                await joined.wait()  # the rest once the second member holds partitions
            await publish(kafka_bootstrap, events[start : start + 20])
            await asyncio.sleep(0.2)

    coord = EtcdCoordination([etcd_endpoint])
    await coord.connect()
    writer = asyncio.create_task(paced())
    try:
        async with InProcessReplicator("a", kafka_bootstrap, coord, address, tmp_path) as first:
            await until(stand_in, lambda: stand_in.commits_of(ds) >= 30)
            second_one = InProcessReplicator("b", kafka_bootstrap, coord, address, tmp_path)
            async with second_one as second:
                await asyncio.wait_for(second.got_partitions.wait(), 60)
                joined.set()
                await writer
                await until(
                    stand_in,
                    lambda: all(stand_in.store.head(ds, k) == e.version for k, e in newest.items()),
                )
            # Its history: the second's leave may already have given it everything back.
            moved = any(a != first.assigned[0] for a in first.assigned[1:])
            assert moved, "no rebalance moved partitions"
    finally:
        writer.cancel()
        await coord.close()
    assert second.loop.handled > 0 and first.loop.handled > 0
    # Every version had at most one effect (a superseded one may be skipped: LWW),
    # whatever was redelivered; the newest of each object is held.
    for e in events:
        assert stand_in.effects(ds, e.key, str(e.version.hlc)) <= 1
    # And every offset is committed: a new member of the group gets none of them.
    async with KafkaConsumer(
        kafka_bootstrap, topics=[CHANGES_TOPIC.name], group_id=group_id("eu-central")
    ) as late:
        leftovers = []
        for _ in range(6):
            leftovers += [r for r in await late.poll(1000, 500) if r.key and ds.encode() in r.key]
    assert leftovers == []


async def test_sigkill_after_the_agents_commit_replays_as_a_no_op(
    world: dict[str, str],
    kafka_bootstrap: str,
    agent: tuple[StandInAgent, str],
    tmp_path: Path,
) -> None:
    stand_in, address = agent
    ds = dataset()
    port = free_port()
    proc = ReplicatorProcess(
        "eu-central", address, world, tmp_path / "procs", metrics_addr=f"127.0.0.1:{port}"
    )
    proc.start()
    try:
        await proc.wait_log("replicator_started")
        stand_in.hold_after_commit = asyncio.Event()
        first = b.put("a", b"one", dataset=ds)
        await publish(kafka_bootstrap, [first])
        await until(stand_in, lambda: stand_in.commits_of(ds) == 1)  # committed; answer held
        proc.kill()
        stand_in.hold_after_commit.set()
        stand_in.hold_after_commit = None
        assert stand_in.effects(ds, "a", str(first.version.hlc)) == 1
        proc.start()  # the same group: it starts from the offset never committed
        await until(stand_in, lambda: stand_in.commits_of(ds) == 2)  # the replay
        # A poison event and a later write: the poison is dead-lettered, the write flows.
        poison = b"\xff\x01poison " + uuid.uuid4().hex.encode()
        later = b.delete("a", dataset=ds)
        await publish(kafka_bootstrap, [(f"{ds}/a".encode(), poison), later])
        await until(stand_in, lambda: stand_in.store.head(ds, "a") == later.version)
        letters = await read_from(
            kafka_bootstrap,
            beginning(DLQ_TOPIC.name, DLQ_TOPIC.partitions),
            lambda r: getattr(r, "value", None) == poison,
        )
        (letter,) = [r for r in letters if getattr(r, "value", None) == poison]
        headers = dict(letter.headers)  # type: ignore[attr-defined]
        assert headers["reason"] == b"undecodable" and headers["region"] == b"eu-central"
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
        assert 'meridian_dlq_total{reason="undecodable"} 1.0' in metrics
        assert "meridian_replication_lag_seconds" in metrics
    finally:
        code = proc.terminate()
    assert code == 0, proc.log()[-3000:]
    # The replay reached the agent, which kept its one effect (LWW: the same version).
    assert stand_in.effects(ds, "a", str(first.version.hlc)) == 1
    assert stand_in.effects(ds, "a", str(later.version.hlc)) == 1
    # `replication status` shows the region's copy once the journal reached the catalog.
    done = run_cli(["replication", "status", "--dataset", ds, "--output", "json"], world)
    assert done.returncode == 0, done.stderr


async def test_a_region_outside_the_placement_never_receives_a_byte(
    world: dict[str, str],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    outsider = StandInAgent(tmp_path / "us-agent", "us-east")
    server, address = await serve(outsider)
    proc = ReplicatorProcess("us-east", address, world, tmp_path / "us", replicator_id="us")
    try:
        proc.start()
        await proc.wait_log("replicator_started")
        ds = dataset()
        # Written under the published revision (one newer would be waited for first).
        revision = await published_revision(world["MERIDIAN_ETCD"])
        events = [b.put(f"k{i}", dataset=ds, policy_revision=revision) for i in range(20)]
        ends = await publish(kafka_bootstrap, events)
        # The group catches up past them (its committed offsets pass them) ...

        async def past() -> bool:
            committed = await group_committed(kafka_bootstrap, group_id("us-east"))
            return all(committed.get(tp, -1) >= end for tp, end in ends.items())

        await waiting.until(past, 60, "the group to commit past the events", step_s=0.2)
    finally:
        proc.terminate()
        await server.stop(grace=None)
    # ... and the agent received nothing.
    assert outsider.commits_of(ds) == 0
    assert outsider.store.head(ds, "k0") is None
    outsider.close()


async def test_an_agent_of_another_region_is_refused_at_start(
    world: dict[str, str], tmp_path: Path
) -> None:
    """Its copies would be stored in eu-west while the records said eu-central holds
    them (MERIDIAN_AGENT exported for `meridian object`, say): one sentence, exit 1."""
    west = StandInAgent(tmp_path / "west-agent", "eu-west")
    server, address = await serve(west)
    proc = ReplicatorProcess("eu-central", address, world, tmp_path / "wrong")
    try:
        proc.start()
        assert proc.proc is not None
        code = await asyncio.to_thread(proc.proc.wait, 60)
    finally:
        proc.terminate()
        await server.stop(grace=None)
        west.close()
    assert code != 0
    assert f"the agent at {address} serves region eu-west, not eu-central" in proc.log()
