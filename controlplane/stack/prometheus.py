"""Prometheus for the demo: Debian's `prometheus` package (installed like the other
engines on first use, see stack/tools.py), run on a configuration written by
controlplane/observability/scrape.py, and queried over its HTTP API."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import httpx

from controlplane.errors import StackError
from controlplane.stack import tools


def binary() -> Path:
    """The prometheus server, installing Debian's package when it is missing."""
    return tools.prometheus_binary()


def argv(config: Path, data_dir: Path, listen: str, *, retention: str = "2h") -> list[str]:
    """The command line of a Prometheus serving `listen` with its data in `data_dir`."""
    return [
        str(binary()),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address={listen}",
        "--web.enable-lifecycle",  # POST /-/reload after the configuration changed
    ]


class PrometheusClient:
    """The few calls of Prometheus's HTTP API the demo and its tests make."""

    def __init__(self, address: str, *, timeout_s: float = 5) -> None:
        self.url = address if "://" in address else f"http://{address}"
        self.timeout_s = timeout_s

    def ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/-/ready", timeout=self.timeout_s).status_code == 200
        return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now (empty when it has no data). Raises
        StackError naming the query when Prometheus rejects it or cannot be reached."""
        try:
            reply = httpx.get(
                f"{self.url}/api/v1/query", params={"query": expr}, timeout=self.timeout_s
            )
            body: Any = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise StackError(f"Prometheus at {self.url} did not answer {expr!r}: {exc}") from exc
        if body.get("status") != "success":
            raise StackError(f"Prometheus at {self.url} refused {expr!r}: {body.get('error')}")
        result = body["data"]["result"]
        return list(result) if isinstance(result, list) else [{"value": result}]

    def targets_up(self) -> dict[str, bool]:
        """Scrape URL → whether its last scrape succeeded."""
        try:
            body: Any = httpx.get(f"{self.url}/api/v1/targets", timeout=self.timeout_s).json()
        except (httpx.HTTPError, ValueError) as exc:
            raise StackError(f"Prometheus at {self.url} did not list its targets: {exc}") from exc
        return {t["scrapeUrl"]: t["health"] == "up" for t in body["data"]["activeTargets"]}

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / 0.2) + 1):
            if self.ready():
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        raise StackError(f"Prometheus at {self.url} was not ready within {timeout_s:g} s")
