"""Apache Kafka 4.x in KRaft mode (broker and controller in one process) on loopback.

Set up as production would be: auto-create off, unclean leader election off,
topics created explicitly by the project. Three listeners:
- PLAINTEXT on the stack's Kafka port, advertised as `kafka_advertised_host:port`
  (configurable, so clients can be routed elsewhere);
- WAN on port+2, advertised as the Toxiproxy proxy `kafka-wan` (port+10002): a
  client that bootstraps through the proxy is also told to reconnect through it,
  so chaos tests really degrade its traffic;
- CONTROLLER on port+1 (KRaft quorum, never advertised).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import subprocess
import uuid
from pathlib import Path

from controlplane.adapters.kafka import PROJECT_TOPICS, KafkaAdmin
from controlplane.errors import StackError
from controlplane.ports.changelog import TopicSpec
from controlplane.settings import Settings
from controlplane.stack import install
from controlplane.stack.single import SingleProcessService

LOG4J_CONFIG = Path(__file__).parent / "kafka" / "log4j2.properties"
HEALTH_TOPIC = TopicSpec("meridian.healthcheck", partitions=1)


def wan_proxy_port(settings: Settings) -> int:
    return settings.stack_kafka_port + 10002


def broker_properties(settings: Settings, data_dir: Path) -> str:
    port = settings.stack_kafka_port
    advertised_port = settings.kafka_advertised_port or port
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{port + 1}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{port + 1},"
            f"WAN://127.0.0.1:{port + 2}",
            f"advertised.listeners=PLAINTEXT://{settings.kafka_advertised_host}:{advertised_port},"
            f"WAN://127.0.0.1:{wan_proxy_port(settings)}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,WAN:PLAINTEXT",
            f"log.dirs={data_dir}",
            "num.partitions=1",
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            # Production habits: the project creates its topics; no data loss on failover.
            "auto.create.topics.enable=false",
            "unclean.leader.election.enable=false",
            "group.initial.rebalance.delay.ms=0",
            "log.retention.hours=24",
            "log.segment.bytes=67108864",
            # A broker SIGKILLed and restarted (the chaos suite does it under load) is
            # refused as a duplicate until its old session lapses: 9 s by default, the
            # biggest part of a restart here. One node, on loopback: 2 s is plenty.
            "broker.session.timeout.ms=2000",
            "broker.heartbeat.interval.ms=500",
            "",
        ]
    )


def new_cluster_id() -> str:
    """A random cluster id in Kafka's form (URL-safe base64 of 16 bytes, unpadded).

    One draw in 64 starts with "-", which the storage tool's argument parser reads
    as an option, so such a draw is made again (Kafka's own generator does the same).
    """
    while True:
        drawn = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not drawn.startswith("-"):
            return drawn


class KafkaService(SingleProcessService):
    name = "kafka"
    stop_timeout_s = 30.0  # Kafka flushes and closes its logs on SIGTERM

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        super().__init__(settings, run_dir)
        self.data_dir = self.run_dir / "data"
        self.config = self.run_dir / "server.properties"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.settings.stack_kafka_port}"

    def install(self) -> None:
        install.kafka_classpath(self.settings.cache_dir)

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            "-Xms256m",
            "-Xmx1g",
            "-XX:+UseG1GC",
            # C1 only: a local broker on two cores starts in about 3/4 of the time when
            # it does not also run the C2 compiler, and peak speed is not what tests need.
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            install.kafka_classpath(self.settings.cache_dir),
            main,
            *args,
        ]

    def _format_storage(self) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = new_cluster_id()
        done = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.config),
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise StackError(
                f"formatting Kafka's storage in {self.data_dir} failed: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}"
            )

    def health(self) -> None:
        async def check() -> None:
            async with KafkaAdmin(self.endpoint, request_timeout_ms=5000) as admin:
                if await admin.cluster_brokers() < 1:
                    raise StackError("Kafka answered a metadata request with no broker")
                await admin.ensure_topics([HEALTH_TOPIC, *PROJECT_TOPICS])

        # While the broker boots, aiokafka logs every refused connection at ERROR; the
        # health loop already reports a broker that never comes up, with its log file.
        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            asyncio.run(asyncio.wait_for(check(), timeout=20))
        finally:
            quiet.setLevel(level)

    def ports(self) -> list[int]:
        port = self.settings.stack_kafka_port
        return [port, port + 1, port + 2]

    def prepare(self) -> list[str]:
        self.config.write_text(broker_properties(self.settings, self.data_dir))
        self._format_storage()
        return self._java("kafka.Kafka", str(self.config))
