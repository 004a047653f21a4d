"""Toxiproxy 2.12 on loopback, the WAN between regions in tests."""

from __future__ import annotations

from pathlib import Path

from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.settings import Settings
from controlplane.stack import install
from controlplane.stack.single import SingleProcessService


class ToxiproxyService(SingleProcessService):
    name = "toxiproxy"

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        # Toxiproxy takes no folder argument, so its port marks our process.
        super().__init__(settings, run_dir, marker=f"-port {settings.stack_toxiproxy_port}")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.settings.stack_toxiproxy_port}"

    def client(self) -> ToxiproxyClient:
        return ToxiproxyClient(f"http://{self.endpoint}", timeout_s=3)

    def install(self) -> None:
        install.toxiproxy_binary(self.settings.cache_dir)

    def ports(self) -> list[int]:
        return [self.settings.stack_toxiproxy_port]

    def prepare(self) -> list[str]:
        binary = install.toxiproxy_binary(self.settings.cache_dir)
        return [str(binary), "-host", "127.0.0.1", "-port", str(self.settings.stack_toxiproxy_port)]

    def health(self) -> None:
        self.client().version()
