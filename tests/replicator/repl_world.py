"""A world for the replicator's integration tests: a catalog with a standard policy
applied and published to etcd (through the `meridian` CLI, as a user would), change
events published to the real Kafka, and `meridian replicator run` as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from harness.children import ChildProcess, popen_logged
from harness.controllers import apply_world, meridian_argv
from waiting import until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaProducer
from controlplane.coordination.protocols import keys
from controlplane.domain.events import ChangeEvent
from controlplane.policy.current import CompiledPolicy
from meridian.convert import encode_change_event

REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"), ("us-east", "US")]

POLICY = """apiVersion: meridian/v1
kind: Topology
metadata:
  name: repl-test
spec:
  regions:
{regions}
  links:
    - between: [eu-west, eu-central]
      rtt: 12ms
    - between: [eu-west, eu-north]
      rtt: 20ms
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: corpus
spec:
  selector:
    datasets: ["corpus/*"]
  class: standard
  home: eu-west
  replicas:
    regions: [eu-central, eu-north]
  residency: [EU]
  rpo: 30s
  failover:
    mode: manual
"""


def prepare_world(folder: Path, etcd: str, kafka: str) -> dict[str, str]:
    """A migrated SQLite catalog with the policy applied and published; returns the env."""
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": etcd,
        "MERIDIAN_KAFKA": kafka,
        "MERIDIAN_HOME": str(folder / "home"),
    }
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    return apply_world(folder, env, POLICY.format(regions=regions))


async def published_revision(etcd: str) -> int:
    """The revision of the policy published in etcd (what events written under it carry:
    a replicator waits for a newer one before it skips an event)."""
    async with EtcdCoordination([etcd], timeout_s=5) as coord:
        found = await coord.get(keys.POLICY_CURRENT)
    assert found is not None, "no policy published"
    return CompiledPolicy.from_json(found.value).revision


async def publish(
    kafka: str, events: Sequence[ChangeEvent | tuple[bytes, bytes]]
) -> dict[TopicPartition, int]:
    """Publish; return, per partition written, the offset just after the last record."""
    ends: dict[TopicPartition, int] = {}
    async with KafkaProducer(kafka) as producer:
        for e in events:
            if isinstance(e, ChangeEvent):
                key, value = e.log_key.encode(), encode_change_event(e)
            else:
                key, value = e
            d = await producer.send(CHANGES_TOPIC.name, key, value)
            tp = TopicPartition(d.topic, d.partition)
            ends[tp] = max(ends.get(tp, 0), d.offset + 1)
    return ends


def beginning(topic: str, partitions: int) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, p): 0 for p in range(partitions)}


async def read_from(
    kafka: str,
    starts: dict[TopicPartition, int],
    predicate: Callable[[object], bool],
    timeout_s: float = 30,
) -> list[object]:
    """Records after `starts` until one satisfies `predicate` (bounded by `timeout_s`)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False)
    await consumer.start()
    found: list[object] = []
    try:
        consumer.assign(list(starts))
        for tp, off in starts.items():
            consumer.seek(tp, off)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(predicate(r) for r in found):
            batches = await consumer.getmany(timeout_ms=500)
            for msgs in batches.values():
                found.extend(msgs)
        return found
    finally:
        await consumer.stop()


async def group_committed(kafka: str, group: str) -> dict[TopicPartition, int]:
    """The committed offsets of a consumer group, per partition (-1 when none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
        return {tp: meta.offset for tp, meta in found.items()}
    finally:
        await admin.close()


@dataclass
class ReplicatorProcess(ChildProcess):
    """One `meridian replicator run` in its own process (and session)."""

    region: str
    agent: str | None  # None: no --agent, one the region registered in etcd (cli.md's form)
    env: dict[str, str]
    folder: Path
    replicator_id: str = "r1"
    metrics_addr: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.folder / f"replicator-{self.replicator_id}.log"

    def start(self) -> ReplicatorProcess:
        args = [*meridian_argv(), "replicator", "run", "--region", self.region]
        if self.agent is not None:
            args += ["--agent", self.agent]
        args += ["--id", self.replicator_id, "--max-attempts", "3"]
        args += ["--journal", str(self.folder / f"journal-{self.replicator_id}.db")]
        if self.metrics_addr is not None:
            args += ["--metrics", self.metrics_addr]
        self.proc = popen_logged(args, self.env, self.log_path)
        return self

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def terminate(self, timeout_s: float = 30) -> int:
        if self.proc is None:
            raise RuntimeError("not started")
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    async def wait_log(self, text: str, timeout_s: float = 60) -> None:
        """Until the log says `text` (the process writes it; a file has no event to await)."""

        def logged() -> bool:
            if text in self.log():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the replicator exited: {self.log()[-2000:]}")
            return False

        await until(logged, timeout_s, f"{text!r} in the log", step_s=0.1)
