"""The chaos suite's private stack: etcd (3 members), Kafka, Toxiproxy, PostgreSQL.

Private: its own folder (`<home>/chaos/stack`) and ports, the stack's ports plus
`PORT_OFFSET`, so it never collides with `meridian stack up` of the same home nor
with another engineer's stack on this machine. Kafka gets one WAN listener per
region (WAN0, WAN1, ... on port+3+i), each advertised at that region's Toxiproxy
proxy (port+10003+i): a client that bootstraps through its region's proxy is
told to reconnect through the same proxy, so cutting it really cuts that region
from Kafka and from nobody else.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from controlplane.settings import Settings, load_settings
from controlplane.stack.etcd import EtcdCluster, EtcdService, plan_etcd_cluster
from controlplane.stack.kafka import KafkaService, broker_properties
from controlplane.stack.model import Service
from controlplane.stack.postgres import PostgresService, postgres_url
from controlplane.stack.toxiproxy import ToxiproxyService

PORT_OFFSET = 50
MAX_REGIONS = 4


def private_settings(base: Settings) -> Settings:
    return load_settings(
        check_endpoints=False,
        home=base.home / "chaos",
        stack_etcd_port=base.stack_etcd_port + PORT_OFFSET,
        stack_kafka_port=base.stack_kafka_port + PORT_OFFSET,
        stack_toxiproxy_port=base.stack_toxiproxy_port + PORT_OFFSET,
        stack_postgres_port=base.stack_postgres_port + PORT_OFFSET,
    )


def region_wan_port(settings: Settings, index: int) -> int:
    """Where region `index` reaches Kafka: its Toxiproxy proxy."""
    return settings.stack_kafka_port + 10003 + index


def region_listener_port(settings: Settings, index: int) -> int:
    return settings.stack_kafka_port + 3 + index


class RegionalKafka(KafkaService):
    """The stack's Kafka with one extra advertised listener per region (up to MAX_REGIONS)."""

    def ports(self) -> list[int]:
        extra = (region_listener_port(self.settings, i) for i in range(MAX_REGIONS))
        return [*super().ports(), *extra]

    def prepare(self) -> list[str]:
        argv = super().prepare()  # writes the base config and formats storage once
        self.config.write_text(regional_properties(self.settings, self.data_dir))
        return argv


def regional_properties(settings: Settings, data_dir: Path) -> str:
    """The stack's broker properties plus a listener WAN<i> per region, each advertised
    at that region's proxy."""
    names = [f"WAN{i}" for i in range(MAX_REGIONS)]
    out = []
    for line in broker_properties(settings, data_dir).splitlines():
        extra = ""
        if line.startswith("listeners="):
            extra = "".join(
                f",{n}://127.0.0.1:{region_listener_port(settings, i)}" for i, n in enumerate(names)
            )
        elif line.startswith("advertised.listeners="):
            extra = "".join(
                f",{n}://127.0.0.1:{region_wan_port(settings, i)}" for i, n in enumerate(names)
            )
        elif line.startswith("listener.security.protocol.map="):
            extra = "".join(f",{n}:PLAINTEXT" for n in names)
        out.append(line + extra)
    return "\n".join(out) + "\n"


def share_cache(base: Settings, private: Settings) -> None:
    """The private home uses the base home's engine cache (Kafka's jars, Toxiproxy's
    build): a link, made once, so the private stack never downloads them again."""
    link = private.cache_dir
    if link.is_symlink() or link.exists():
        return
    base.cache_dir.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(base.cache_dir.resolve(), target_is_directory=True)


class PrivateStack:
    """Start the private engines of the chaos suite; `down` stops those this object
    started (a stack already up, e.g. a test session's, is reused and left up)."""

    def __init__(self, base: Settings) -> None:
        self.settings = private_settings(base)
        share_cache(base, self.settings)
        self.run_dir = self.settings.stack_dir.resolve()
        s = self.settings
        self.etcd = EtcdService(self.run_dir, 3, s.stack_etcd_port, s.stack_start_timeout_s)
        self.toxiproxy = ToxiproxyService(s, self.run_dir)
        self.kafka = RegionalKafka(s, self.run_dir)
        self.postgres = PostgresService(s, self.run_dir)
        self.started: list[Service] = []

    @property
    def services(self) -> list[Service]:
        return [self.etcd, self.toxiproxy, self.kafka, self.postgres]

    def up(self) -> None:
        self._forget_stopped_etcd()
        try:
            for service in self.services:
                service.install()
                if service.start():
                    self.started.append(service)
        except BaseException:
            self.down()
            raise

    def _forget_stopped_etcd(self) -> None:
        """A stopped private etcd is begun afresh: each world uses a keyspace of its own,
        and data left from another run (other ports, a killed member) could keep the
        three members from ever forming one cluster again."""
        if self.etcd_cluster().members and any(
            m.pid is not None for m in self.etcd_cluster().members
        ):
            return
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.etcd.run_dir)

    def down(self) -> None:
        for service in reversed(self.started):
            service.stop()
        self.started.clear()

    def etcd_cluster(self) -> EtcdCluster:
        return plan_etcd_cluster(
            self.etcd.run_dir, 3, self.settings.stack_etcd_port, self.settings.stack_etcd_port + 1
        )

    @property
    def etcd_endpoints(self) -> list[str]:
        return self.etcd_cluster().endpoints

    @property
    def kafka_endpoint(self) -> str:
        return self.kafka.endpoint

    @property
    def toxiproxy_url(self) -> str:
        return f"http://{self.toxiproxy.endpoint}"

    @property
    def postgres_url(self) -> str:
        return postgres_url(self.settings.stack_postgres_port)
