"""The demo's regions as real processes on the local stack.

Each region runs `meridian controller run`, `meridian agent serve` and `meridian
replicator run` as processes of their own (so that a region can be SIGKILLed), all
sharing the stack's etcd and Kafka and a catalog of the run. Agents talk to other
regions' agents through one Toxiproxy proxy per ordered pair of regions, with half
the link's RTT of latency each way (`MERIDIAN_AGENT_ROUTES` tells each region's
processes where its links are), so transfers pay a WAN's round trips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.errors import StackError
from controlplane.logs import get_logger
from controlplane.loopback import free_port

log = get_logger("meridian.demo")

DAEMONS = ("controller", "agent", "replicator")


def meridian_argv() -> list[str]:
    """How to run this installation's `meridian` (the console script beside Python)."""
    script = Path(sys.executable).with_name("meridian")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from controlplane.cli.entry import entry; entry()"]


@dataclass
class Daemon:
    """One daemon process of a region, its log and its metrics endpoint."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    metrics: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C of the demo reaches it through stop() only
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> None:
        """Until its metrics endpoint answers; one clear error (with its log's tail) if
        it exits or does not answer in time."""
        deadline = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / 0.1) + 1):
            if not self.running:
                raise StackError(f"{self.name} exited at start: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{self.metrics}/metrics", timeout=1).status_code == 200:
                    return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise StackError(f"{self.name} did not answer within {timeout_s:g} s: {self.tail()}")

    def tail(self, lines: int = 3) -> str:
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM without waiting (stop() waits), so that many daemons stop together."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 15) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Region:
    name: str
    jurisdiction: str
    agent_listen: str
    kinds: tuple[str, ...] = DAEMONS  # which daemons it runs
    # Chosen once, so that a region started again scrapes at the same addresses.
    metrics: dict[str, str] = field(default_factory=dict)
    daemons: dict[str, Daemon] = field(default_factory=dict)


class World:
    """The demo's regions, links and catalog, under one run folder."""

    def __init__(
        self,
        run_dir: Path,
        *,
        regions: dict[str, str],
        rtt_ms: dict[frozenset[str], int],
        etcd: str,
        kafka: str,
        toxiproxy: str,
        lease_ttl_s: int = 3,
        kinds: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.catalog = f"sqlite:///{run_dir / 'catalog.db'}"
        self.etcd, self.kafka, self.lease_ttl_s = etcd, kafka, lease_ttl_s
        self.toxi = ToxiproxyClient(toxiproxy if "://" in toxiproxy else f"http://{toxiproxy}")
        self.rtt_ms = rtt_ms
        self.regions = {
            name: Region(
                name,
                jur,
                f"127.0.0.1:{free_port()}",
                kinds=(kinds or {}).get(name, DAEMONS),
                metrics={kind: f"127.0.0.1:{free_port()}" for kind in DAEMONS},
            )
            for name, jur in regions.items()
        }
        self.links: dict[tuple[str, str], str] = {}  # (from, to) -> proxy listen address

    # -- the common environment ------------------------------------------------------------
    def env(self, region: str | None = None) -> dict[str, str]:
        env = {
            "MERIDIAN_ETCD": self.etcd,
            "MERIDIAN_KAFKA": self.kafka,
            "MERIDIAN_CATALOG": self.catalog,
            "MERIDIAN_LEASE_TTL_S": str(self.lease_ttl_s),
            "MERIDIAN_HOME": str(self.run_dir / "home"),
        }
        if region is not None:
            routes = [f"{to}={addr}" for (frm, to), addr in self.links.items() if frm == region]
            env["MERIDIAN_AGENT_ROUTES"] = ",".join(sorted(routes))
        return env

    def cli(
        self, *args: str, timeout_s: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `meridian ARGS` as a user would, with the demo's connection settings."""
        return subprocess.run(
            [*meridian_argv(), *args],
            cwd=cwd,
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def cli_json(self, *args: str, timeout_s: float = 120) -> object:
        done = self.cli(*args, "--output", "json", timeout_s=timeout_s)
        if done.returncode not in (0, 2, 3):
            raise StackError(f"`meridian {' '.join(args)}` failed: {done.stderr.strip()}")
        return json.loads(done.stdout)

    # -- links -------------------------------------------------------------------------------
    def make_links(self) -> None:
        for frm in self.regions:
            for to, target in self.regions.items():
                if frm == to:
                    continue
                name = f"meridian-demo-{frm}-to-{to}"
                listen = f"127.0.0.1:{free_port()}"
                with contextlib.suppress(Exception):
                    self.toxi.delete_proxy(name)  # a previous run's, killed before it cleaned
                self.toxi.create_proxy(name, listen, target.agent_listen)
                rtt = self.rtt_ms.get(frozenset((frm, to)), 0)
                if rtt:
                    self.toxi.add_latency(name, max(1, rtt // 2))
                self.links[(frm, to)] = listen

    def drop_links(self) -> None:
        for frm, to in list(self.links):
            with contextlib.suppress(Exception):
                self.toxi.delete_proxy(f"meridian-demo-{frm}-to-{to}")
        self.links.clear()

    # -- regions -----------------------------------------------------------------------------
    def daemons_of(self, region: str) -> dict[str, Daemon]:
        r = self.regions[region]
        logs = self.run_dir / "logs"
        env = self.env(region)
        base = meridian_argv()
        ports = r.metrics
        root = self.run_dir / "agents" / region
        return {
            "controller": Daemon(
                f"{region} controller",
                [*base, "controller", "run", "--region", region, "--metrics", ports["controller"]],
                env,
                logs / f"{region}-controller.log",
                ports["controller"],
            ),
            "agent": Daemon(
                f"{region} agent",
                [
                    *base, "agent", "serve", "--region", region, "--root", str(root),
                    "--listen", r.agent_listen, "--metrics", ports["agent"],
                ],
                env,
                logs / f"{region}-agent.log",
                ports["agent"],
            ),
            "replicator": Daemon(
                f"{region} replicator",
                [
                    *base, "replicator", "run", "--region", region, "--agent", r.agent_listen,
                    "--metrics", ports["replicator"],
                ],
                env,
                logs / f"{region}-replicator.log",
                ports["replicator"],
            ),
        }  # fmt: skip

    def start_region(self, region: str, timeout_s: float = 60) -> None:
        self.start_regions([region], timeout_s)

    def start_regions(self, names: list[str], timeout_s: float = 90) -> None:
        """Start every daemon of the regions at once, then wait for each: on two cores
        their Python start-up overlaps with the others' waits."""
        for region in names:
            r = self.regions[region]
            everything = self.daemons_of(region)
            r.daemons = {kind: everything[kind] for kind in r.kinds}
            for d in r.daemons.values():
                d.start()
        for region in names:
            r = self.regions[region]
            for d in r.daemons.values():
                d.wait_ready(timeout_s)
            log.info("region_started", region=region, agent=r.agent_listen)

    def kill_region(self, region: str) -> None:
        """SIGKILL every process of the region, as a lost datacenter."""
        for d in self.regions[region].daemons.values():
            d.kill()

    def metrics_endpoints(self) -> dict[str, list[str]]:
        """Prometheus jobs: daemon kind → endpoints of every region."""
        jobs: dict[str, list[str]] = {name: [] for name in DAEMONS}
        for r in self.regions.values():
            for kind in r.kinds:
                jobs[kind].append(r.metrics[kind])
        return {job: addresses for job, addresses in jobs.items() if addresses}

    def metrics_regions(self) -> dict[str, str]:
        """Metrics address → region, for the scrape configuration's labels."""
        return {addr: r.name for r in self.regions.values() for addr in r.metrics.values()}

    def pids(self) -> list[int]:
        return [
            d.proc.pid
            for r in self.regions.values()
            for d in r.daemons.values()
            if d.proc is not None and d.running
        ]

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM every daemon at once, wait for them (SIGKILL after `timeout_s`), and
        remove the links."""
        daemons = [d for r in self.regions.values() for d in r.daemons.values()]
        for d in daemons:
            d.terminate()
        deadline = time.monotonic() + timeout_s
        for d in daemons:
            d.stop(max(0.1, deadline - time.monotonic()))
        self.drop_links()

    def clean(self) -> None:
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir, ignore_errors=True)
