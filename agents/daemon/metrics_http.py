"""The agent's Prometheus endpoint (`--metrics HOST:PORT`) and its store gauges.

The gauges of the store (`meridian_agent_objects`, `meridian_agent_bytes_stored`)
are read at scrape time from the store's usage counters (one SQLite row, kept by
triggers), so they are current at every scrape without a polling task. The HTTP
server is prometheus_client's, in a thread of its own; port 0 lets the OS choose
(`address` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from agents.daemon.config import parse_listen
from agents.metrics import AgentMetrics
from agents.store.model import Usage
from controlplane.errors import ConfigError
from controlplane.logs import get_logger

log = get_logger("meridian.agent")


def bind_store_gauges(metrics: AgentMetrics, usage: Callable[[], Usage]) -> None:
    """Have the store gauges read `usage()` at each scrape."""

    def read(field: str) -> Callable[[], float]:
        def value() -> float:
            try:
                return float(getattr(usage(), field))
            except Exception:  # noqa: BLE001 - a closed store at shutdown: report nothing
                return float("nan")

        return value

    metrics.objects.set_function(read("objects"))
    metrics.bytes_stored.set_function(read("bytes"))


class MetricsEndpoint:
    """Serves `metrics.registry` over HTTP until `close()`."""

    def __init__(self, metrics: AgentMetrics, addr: str) -> None:
        host, port = parse_listen(addr, "--metrics")
        try:
            server, thread = start_http_server(port, host, registry=metrics.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}: {exc.strerror or exc}") from None
        self._server: WSGIServer | None = server
        self._thread = thread
        self.address = f"{host}:{server.server_port}"
        log.info("metrics_serving", address=self.address)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5)
