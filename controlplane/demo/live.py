"""What the demo shows while it runs.

On a terminal: the story's lines scroll above a live table of the regions (processes
up, datasets owned with their epochs, replication lag, transfer rate), refreshed
about once a second from etcd and the daemons' own metrics endpoints. Elsewhere (CI,
a pipe): each line of the story is one structlog line on stderr, and no table."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from controlplane.demo.probe import Probe
from controlplane.demo.world import World
from controlplane.logs import get_logger

log = get_logger("meridian.demo")


@dataclass
class RegionView:
    name: str
    up: str = ""
    owns: list[str] = field(default_factory=list)
    lag_s: float | None = None
    sent_bytes: float = 0.0  # wire bytes the agent received (every transfer is recorded there)
    rate: float = 0.0  # wire bytes per second since the poll before


def scrape(address: str, timeout_s: float = 1.0) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of a metrics endpoint; nothing when it is down."""
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=timeout_s).text
    except httpx.HTTPError:
        return
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, float(sample.value)


class Narrator:
    """`say` for the story, with the live table on a terminal (a context manager)."""

    def __init__(self, *, tty: bool) -> None:
        self.tty = tty
        self.world: World | None = None
        self.probe: Probe | None = None
        self.views: dict[str, RegionView] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: object | None = None
        self._polled_at = 0.0

    def say(self, line: str) -> None:
        if self._live is not None:
            from rich.live import Live

            assert isinstance(self._live, Live)  # noqa: S101 - set by watch() only
            self._live.console.print(line, highlight=False)
        elif self.tty:
            # The narrative goes to stderr: stdout carries only the table or the JSON.
            print(line, file=sys.stderr, flush=True)
        else:
            log.info(line.strip())

    def watch(self, world: World, probe: Probe) -> None:
        """Start the live table (on a terminal only) for these regions."""
        self.world, self.probe = world, probe
        self.views = {name: RegionView(name) for name in world.regions}
        if not self.tty:
            return
        from rich.console import Console
        from rich.live import Live

        live = Live(
            get_renderable=self.render,
            console=Console(stderr=True),
            refresh_per_second=2,
            transient=False,
        )
        live.start()
        self._live = live
        self._thread = threading.Thread(target=self._poll_loop, name="demo-live", daemon=True)
        self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):  # a view must never end the demo
                self.poll()

    def poll(self) -> None:
        world, probe = self.world, self.probe
        if world is None or probe is None:
            return
        now = time.monotonic()
        elapsed = max(1e-3, now - self._polled_at) if self._polled_at else 0.0
        self._polled_at = now
        owners = probe.owners()
        for name, region in world.regions.items():
            view = self.views[name]
            running = [k for k, d in region.daemons.items() if d.running]
            view.up = ", ".join(running) if running else "down"
            view.owns = sorted(f"{ds} @{epoch}" for ds, (r, epoch) in owners.items() if r == name)
            lags = [
                value
                for sample, _labels, value in scrape(region.metrics["replicator"])
                if sample == "meridian_replication_lag_seconds"
            ] if "replicator" in region.daemons else []  # fmt: skip
            view.lag_s = max(lags) if lags else None
            sent = sum(
                value
                for sample, labels, value in scrape(region.metrics["agent"])
                if sample == "meridian_transfer_bytes_total"
                and labels.get("kind") == "wire"
                and labels.get("direction") == "in"
            )
            if elapsed and sent >= view.sent_bytes:
                view.rate = (sent - view.sent_bytes) / elapsed
            view.sent_bytes = sent

    def render(self) -> Table:

        table = Table(title="meridian demo: regions", expand=False)
        for column in ("region", "processes", "owns (dataset @epoch)", "lag", "in/s"):
            table.add_column(column)
        for view in self.views.values():
            table.add_row(
                view.name,
                view.up or "…",
                ", ".join(view.owns) or "-",
                "-" if view.lag_s is None else f"{view.lag_s:.1f} s",
                _rate(view.rate),
            )
        return table

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        live, self._live = self._live, None
        if live is not None:
            from rich.live import Live

            assert isinstance(live, Live)  # noqa: S101 - set by watch() only
            live.stop()

    def __enter__(self) -> Narrator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _rate(bytes_per_s: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if bytes_per_s < 1000 or unit == "GB":
            return f"{bytes_per_s:.0f} {unit}/s" if unit == "B" else f"{bytes_per_s:.1f} {unit}/s"
        bytes_per_s /= 1000
    return ""
