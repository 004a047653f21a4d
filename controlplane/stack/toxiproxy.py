"""Toxiproxy 2.12 on loopback, the WAN between regions in tests."""

from __future__ import annotations

from pathlib import Path

from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.settings import Settings
from controlplane.stack import install
from controlplane.stack.model import ServiceStatus
from controlplane.stack.process import ManagedProcess, require_free_ports, wait_healthy


class ToxiproxyService:
    name = "toxiproxy"

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        self.settings = settings
        self.run_dir = (run_dir / "toxiproxy").resolve()
        self.process = ManagedProcess(
            name="toxiproxy",
            pid_file=self.run_dir / "toxiproxy.pid",
            log_file=self.run_dir / "toxiproxy.log",
            marker=f"-port {settings.stack_toxiproxy_port}",
        )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.settings.stack_toxiproxy_port}"

    def client(self) -> ToxiproxyClient:
        return ToxiproxyClient(f"http://{self.endpoint}", timeout_s=3)

    def install(self) -> None:
        install.toxiproxy_binary(self.settings.cache_dir)

    def _health(self) -> None:
        self.client().version()

    def start(self) -> bool:
        if self.process.pid() is not None:
            wait_healthy("toxiproxy", self.process, self._health, 10)
            return False
        require_free_ports("toxiproxy", [self.settings.stack_toxiproxy_port])
        binary = install.toxiproxy_binary(self.settings.cache_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.process.start(
            [str(binary), "-host", "127.0.0.1", "-port", str(self.settings.stack_toxiproxy_port)]
        )
        try:
            wait_healthy(
                "toxiproxy", self.process, self._health, self.settings.stack_start_timeout_s
            )
        except Exception:
            self.process.stop()
            raise
        return True

    def status(self) -> list[ServiceStatus]:
        pid = self.process.pid()
        return [
            ServiceStatus(
                "toxiproxy", "up" if pid else "down", self.endpoint, pid, str(self.process.log_file)
            )
        ]

    def stop(self) -> bool:
        return self.process.stop()
