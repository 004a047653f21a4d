"""The local stack as a whole: which services, in which order, and what was started.

`up` is idempotent: a service already running is only health-checked. If a
service fails to come up, the services this call started are stopped again, so
no half-started stack is left behind. `down` stops only processes recorded in
our pid files (see `process.ManagedProcess`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.errors import StackError
from controlplane.logs import get_logger
from controlplane.settings import Settings
from controlplane.stack.etcd import EtcdService
from controlplane.stack.kafka import KafkaService, wan_proxy_port
from controlplane.stack.model import Service, ServiceStatus
from controlplane.stack.postgres import PostgresService, postgres_url
from controlplane.stack.toxiproxy import ToxiproxyService

log = get_logger(__name__)

CORE_SERVICES = ("etcd", "toxiproxy", "kafka")
KAFKA_WAN_PROXY = "kafka-wan"


@dataclass
class UpReport:
    started: list[str] = field(default_factory=list)
    already_up: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.run_dir = settings.stack_dir.resolve()
        self.state_file = self.run_dir / "state.json"

    def _state(self) -> dict[str, object]:
        try:
            loaded = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def _etcd_members(self, requested: int | None = None) -> int:
        if requested is not None:
            return requested
        members = self._state().get("etcd_members", 1)
        return members if isinstance(members, int) else 1

    def services(self, etcd_members: int | None = None) -> dict[str, Service]:
        s = self.settings
        return {
            "etcd": EtcdService(
                self.run_dir,
                self._etcd_members(etcd_members),
                s.stack_etcd_port,
                s.stack_start_timeout_s,
            ),
            "toxiproxy": ToxiproxyService(s, self.run_dir),
            "kafka": KafkaService(s, self.run_dir),
            "postgres": PostgresService(s, self.run_dir),
        }

    def up(
        self,
        *,
        etcd_members: int | None = None,
        postgres: bool = False,
        only: tuple[str, ...] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> UpReport:
        names = list(only) if only else [*CORE_SERVICES, *(["postgres"] if postgres else [])]
        services = self.services(etcd_members)
        unknown = [n for n in names if n not in services]
        if unknown:
            raise StackError(f"unknown stack service {unknown[0]!r}; known: {', '.join(services)}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        report = UpReport()
        started_here: list[Service] = []
        try:
            for name in names:
                service = services[name]
                if progress:
                    progress(f"{name}: installing (first time only) and starting")
                t0 = time.monotonic()
                service.install()
                if service.start():
                    started_here.append(service)
                    report.started.append(name)
                else:
                    report.already_up.append(name)
                report.seconds[name] = round(time.monotonic() - t0, 1)
                log.info("stack service up", service=name, seconds=report.seconds[name])
                if name == "etcd":
                    self._record(etcd_members=self._etcd_members(etcd_members))
            if "kafka" in names and "toxiproxy" in names:
                self._wire_kafka_wan()
        except BaseException:
            for service in reversed(started_here):
                service.stop()
            raise
        return report

    def _wire_kafka_wan(self) -> None:
        """The WAN listener of Kafka is reached through Toxiproxy (see stack/kafka.py)."""
        ToxiproxyService(self.settings, self.run_dir).client().create_proxy(
            KAFKA_WAN_PROXY,
            listen=f"127.0.0.1:{wan_proxy_port(self.settings)}",
            upstream=f"127.0.0.1:{self.settings.stack_kafka_port + 2}",
        )

    def _record(self, **fields: object) -> None:
        state = self._state()
        state.update(fields)
        self.state_file.write_text(json.dumps(state) + "\n")

    def status(self) -> list[ServiceStatus]:
        rows: list[ServiceStatus] = []
        for name, service in self.services().items():
            found = service.status()
            never_asked = name == "postgres" and not (self.run_dir / "postgres").exists()
            if never_asked and all(r.state == "down" for r in found):
                continue  # PostgreSQL is only part of the stack when --postgres asked for it
            rows.extend(found)
        return rows

    def down(self) -> list[str]:
        stopped = []
        # Reverse start order: clients of etcd and Kafka first, etcd last.
        for name, service in reversed(list(self.services().items())):
            if service.stop():
                stopped.append(name)
        return stopped


def endpoints(settings: Settings) -> dict[str, str]:
    """Where the stack's services listen (what `stack up` prints)."""
    return {
        "etcd": ",".join(
            f"127.0.0.1:{settings.stack_etcd_port + 10 * i}"
            for i in range(Stack(settings)._etcd_members())
        ),
        "kafka": f"127.0.0.1:{settings.stack_kafka_port}",
        "kafka (through the WAN proxy)": f"127.0.0.1:{wan_proxy_port(settings)}",
        "toxiproxy": f"http://127.0.0.1:{settings.stack_toxiproxy_port}",
        "postgres": postgres_url(settings.stack_postgres_port),
    }
