"""Regions of real processes on the private stack, every inter-region link a proxy.

Each region reaches etcd (one proxy per member), Kafka (its own advertised WAN
listener, see `chaos.stack`) and the catalog (PostgreSQL) through Toxiproxy
proxies of its own, named `chaos-<region>-<link>`, so a fault can cut one
region from one engine and leave everyone else alone. Agent-to-agent links (one
proxy per ordered pair) are routed with MERIDIAN_AGENT_ROUTES once agents run.

The region's processes are `Daemon`s of the demo's launcher (controlplane.demo.world),
reused as they are; this module adds pausing (SIGSTOP/SIGCONT) and the proxies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from chaos.stack import MAX_REGIONS, PrivateStack, region_wan_port
from chaos.toxiproxy import AsyncToxiproxy
from controlplane.demo.world import Daemon, meridian_argv
from controlplane.errors import StackError
from controlplane.logs import get_logger
from controlplane.loopback import free_port
from controlplane.stack.postgres import DB_USER, postgres_url

log = get_logger("meridian.chaos")

TEMPLATE_PREFIX = "chaos_template_"


def template_db() -> str:
    """The migrated template's name carries the migration head, so a template made
    before a new migration landed is never copied (a new one is made beside it)."""
    from controlplane.catalog.migrate import head_revision

    return TEMPLATE_PREFIX + head_revision().replace("-", "_")


@dataclass
class ChaosRegion:
    name: str
    jurisdiction: str
    index: int
    proxies: dict[str, str] = field(default_factory=dict)  # link name -> listen address
    daemons: dict[str, Daemon] = field(default_factory=dict)
    agent_listen: str = ""  # this region's agent (its own clients reach it directly)

    def proxy_name(self, link: str) -> str:
        return f"chaos-{self.name}-{link}"

    def links(self, prefix: str) -> list[str]:
        return [self.proxy_name(n) for n in self.proxies if n.startswith(prefix)]

    @property
    def etcd(self) -> str:
        return ",".join(v for k, v in sorted(self.proxies.items()) if k.startswith("etcd"))


def signal_daemon(daemon: Daemon, sig: signal.Signals) -> None:
    if daemon.proc is not None and daemon.proc.poll() is None:
        os.kill(daemon.proc.pid, sig)


class ChaosWorld:
    """The regions of one run, under `run_dir`, on `stack`."""

    def __init__(
        self,
        stack: PrivateStack,
        run_dir: Path,
        regions: list[tuple[str, str]],
        *,
        lease_ttl_s: int = 3,
    ) -> None:
        self.stack = stack
        self.run_dir = run_dir
        self.lease_ttl_s = lease_ttl_s
        if not 0 < len(regions) <= MAX_REGIONS:
            raise ValueError(f"a chaos world has 1 to {MAX_REGIONS} regions, not {len(regions)}")
        self.regions = {name: ChaosRegion(name, jur, i) for i, (name, jur) in enumerate(regions)}
        self.database = f"chaos_{run_dir.name.replace('-', '_')}"
        self.toxi = AsyncToxiproxy(stack.toxiproxy_url)
        self.fence_dir = run_dir / "fence"
        # Per region, extra settings of its agent and replicator (scenario 13's clock).
        self.data_env: dict[str, dict[str, str]] = {}

    @property
    def catalog_direct(self) -> str:
        return postgres_url(self.stack.settings.stack_postgres_port, self.database)

    def catalog_of(self, region: ChaosRegion) -> str:
        host_port = region.proxies["catalog"]
        return f"postgresql+psycopg://{DB_USER}@{host_port}/{self.database}"

    def env(self, region: ChaosRegion | None) -> dict[str, str]:
        env = {
            "MERIDIAN_HOME": str(self.run_dir / "home"),
            "MERIDIAN_LEASE_TTL_S": str(self.lease_ttl_s),
            "MERIDIAN_ETCD": ",".join(self.stack.etcd_endpoints),
            "MERIDIAN_KAFKA": self.stack.kafka_endpoint,
            "MERIDIAN_CATALOG": self.catalog_direct,
            "MERIDIAN_LOG_LEVEL": "info",
        }
        if region is not None:
            env["MERIDIAN_ETCD"] = region.etcd
            env["MERIDIAN_KAFKA"] = region.proxies["kafka"]
            env["MERIDIAN_CATALOG"] = self.catalog_of(region)
            routes = [
                f"{k.removeprefix('agent-to-')}={v}"
                for k, v in region.proxies.items()
                if k.startswith("agent-to-")
            ]
            env["MERIDIAN_AGENT_ROUTES"] = ",".join(sorted(routes))
        return env

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*meridian_argv(), *args],
            env={**os.environ, **self.env(None)},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def journal(self) -> list[dict[str, object]] | None:
        """The failover journal's moves (`dataset`, `epoch`, `to`, as `meridian history
        --output json` names them), or None while the catalog is down. Read straight from
        the catalog's `failovers` table: on a loaded machine the CLI's start alone took
        over 30 s, so a poll of it missed rows that were there."""
        url = self.catalog_direct.replace("postgresql+psycopg://", "postgresql://", 1)
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                rows = conn.execute("SELECT dataset, epoch, to_region FROM failovers").fetchall()
        except psycopg.Error:
            return None
        return [{"dataset": d, "epoch": int(e), "to": t} for d, e, t in rows]

    async def owned_gauges(self) -> dict[str, float | None]:
        """Each region's controller's `meridian_controller_datasets_owned` (None: no answer)."""
        out: dict[str, float | None] = {}
        async with httpx.AsyncClient(timeout=2) as http:
            for r in self.regions.values():
                d = r.daemons.get("controller")
                out[r.name] = None
                if d is None or not d.running:
                    continue
                try:
                    text = (await http.get(f"http://{d.metrics}/metrics")).text
                except httpx.HTTPError:
                    continue
                for family in text_string_to_metric_families(text):
                    if family.name == "meridian_controller_datasets_owned":
                        out[r.name] = sum(sample.value for sample in family.samples)
        return out

    # -- set-up ------------------------------------------------------------------------------
    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        port = self.stack.settings.stack_postgres_port
        return psycopg.connect(
            host="127.0.0.1", port=port, user=DB_USER, dbname="postgres", autocommit=True,
            connect_timeout=5,
        )  # fmt: skip

    def create_catalog(self, policy: Path) -> None:
        """A fresh database of this run, migrated, with the policy applied and published.

        Migrating costs seconds per run, so the stack keeps a migrated template per
        migration head (made on first use, as `meridian db upgrade` makes it) and each
        run's database is a copy of it."""
        template = template_db()
        with self._admin() as conn:
            have = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (template,)
            ).fetchone()
        if have is None:
            self._migrate_template(template)
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}"')
            conn.execute(f'CREATE DATABASE "{self.database}" TEMPLATE "{template}"')
        done = self.cli("policy", "apply", str(policy), "--yes")
        if done.returncode != 0:
            raise StackError(f"meridian policy apply failed: {done.stderr.strip()}")

    def _migrate_template(self, template: str) -> None:
        staging = f"{template}_partial"
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{staging}"')
            conn.execute(f'CREATE DATABASE "{staging}"')
        url = postgres_url(self.stack.settings.stack_postgres_port, staging)
        done = subprocess.run(
            [*meridian_argv(), "db", "upgrade"],
            env={**os.environ, **self.env(None), "MERIDIAN_CATALOG": url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(f"meridian db upgrade failed: {done.stderr.strip()}")
        with self._admin() as conn:  # renamed only once whole: never a half-migrated template
            conn.execute(f'ALTER DATABASE "{staging}" RENAME TO "{template}"')

    def drop_catalog(self) -> None:
        port = self.stack.settings.stack_postgres_port
        try:
            with psycopg.connect(
                host="127.0.0.1", port=port, user=DB_USER, dbname="postgres", autocommit=True,
                connect_timeout=3,
            ) as conn:  # fmt: skip
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        except psycopg.Error as exc:
            log.warning("chaos_catalog_not_dropped", database=self.database, error=str(exc))

    async def make_proxies(self, *, agents: bool = False) -> None:
        """Each region's proxies to etcd, Kafka and the catalog; with `agents`, also one
        per ordered pair of regions to the other region's agent (`agent-to-<region>`,
        routed by MERIDIAN_AGENT_ROUTES), so a fault can tear one direction of one link."""
        if agents:
            for r in self.regions.values():
                r.agent_listen = f"127.0.0.1:{free_port()}"
        members = self.stack.etcd_endpoints
        pg = f"127.0.0.1:{self.stack.settings.stack_postgres_port}"
        kafka_wan = self.stack.settings.stack_kafka_port + 3
        for r in self.regions.values():
            wanted = {f"etcd{i}": (f"127.0.0.1:{free_port()}", m) for i, m in enumerate(members)}
            wanted["catalog"] = (f"127.0.0.1:{free_port()}", pg)
            wanted["kafka"] = (
                f"127.0.0.1:{region_wan_port(self.stack.settings, r.index)}",
                f"127.0.0.1:{kafka_wan + r.index}",
            )
            if agents:
                for other in self.regions.values():
                    if other.name != r.name:
                        listen = f"127.0.0.1:{free_port()}"
                        wanted[f"agent-to-{other.name}"] = (listen, other.agent_listen)
            for link, (listen, upstream) in wanted.items():
                await self.toxi.create_proxy(r.proxy_name(link), listen, upstream)
                r.proxies[link] = listen

    async def drop_proxies(self) -> None:
        for r in self.regions.values():
            for link in list(r.proxies):
                try:
                    await self.toxi.delete_proxy(r.proxy_name(link))
                except Exception as exc:  # noqa: BLE001 - best effort at teardown
                    log.warning("chaos_proxy_not_deleted", proxy=r.proxy_name(link), error=str(exc))
            r.proxies.clear()

    async def heal(self) -> None:
        """Every proxy clean and enabled, every process resumed."""
        for r in self.regions.values():
            for link in r.proxies:
                await self.toxi.clear(r.proxy_name(link))
            for d in r.daemons.values():
                signal_daemon(d, signal.SIGCONT)

    # -- processes ---------------------------------------------------------------------------
    def controller(self, region: ChaosRegion) -> Daemon:
        metrics = f"127.0.0.1:{free_port()}"
        argv = [
            *meridian_argv(), "controller", "run", "--region", region.name,
            "--id", f"{region.name}-chaos", "--lease-ttl", str(self.lease_ttl_s),
            "--fence-dir", str(self.fence_dir), "--metrics", metrics,
        ]  # fmt: skip
        return Daemon(
            f"{region.name} controller",
            argv,
            self.env(region),
            self.run_dir / "logs" / f"{region.name}-controller.log",
            metrics,
        )

    def start_controllers(self, timeout_s: float = 60) -> None:
        for r in self.regions.values():
            r.daemons["controller"] = self.controller(r)
            r.daemons["controller"].start()
        for r in self.regions.values():
            r.daemons["controller"].wait_ready(timeout_s)

    def agent(self, region: ChaosRegion) -> Daemon:
        metrics = f"127.0.0.1:{free_port()}"
        root = self.run_dir / "agents" / region.name
        argv = [
            *meridian_argv(), "agent", "serve", "--region", region.name, "--root", str(root),
            "--listen", region.agent_listen, "--metrics", metrics,
        ]  # fmt: skip
        return Daemon(
            f"{region.name} agent",
            argv,
            {**self.env(region), **self.data_env.get(region.name, {})},
            self.run_dir / "logs" / f"{region.name}-agent.log",
            metrics,
        )

    def replicator(self, region: ChaosRegion) -> Daemon:
        metrics = f"127.0.0.1:{free_port()}"
        argv = [
            *meridian_argv(), "replicator", "run", "--region", region.name,
            "--agent", region.agent_listen, "--metrics", metrics,
        ]  # fmt: skip
        return Daemon(
            f"{region.name} replicator",
            argv,
            {**self.env(region), **self.data_env.get(region.name, {})},
            self.run_dir / "logs" / f"{region.name}-replicator.log",
            metrics,
        )

    def start_data_plane(self, timeout_s: float = 60) -> None:
        """An agent and a replicator in every region (after `make_proxies(agents=True)`)."""
        for r in self.regions.values():
            if not r.agent_listen:
                raise StackError("the data plane needs the agent links: make_proxies(agents=True)")
            r.daemons["agent"] = self.agent(r)
            r.daemons["agent"].start()
        for r in self.regions.values():
            r.daemons["agent"].wait_ready(timeout_s)
        for r in self.regions.values():
            r.daemons["replicator"] = self.replicator(r)
            r.daemons["replicator"].start()
        for r in self.regions.values():
            r.daemons["replicator"].wait_ready(timeout_s)

    def restart(self, region: ChaosRegion, kind: str, timeout_s: float = 60) -> None:
        """Start a (killed) daemon of the region again, same ports, same root, same log."""
        daemon = region.daemons[kind]
        daemon.kill()
        daemon.start()
        daemon.wait_ready(timeout_s)

    def logs_of(self, kind: str) -> dict[str, list[str]]:
        """Every region's `kind` daemon's log lines (all its restarts: the log is appended)."""
        out: dict[str, list[str]] = {}
        for r in self.regions.values():
            d = r.daemons.get(kind)
            if d is not None and d.log_path.exists():
                out[r.name] = d.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return out

    def stop_all(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every daemon at once, then wait for each (SIGKILL past the timeout):
        one by one, their shutdown graces would add up."""
        daemons = [d for r in self.regions.values() for d in r.daemons.values()]
        for d in daemons:
            signal_daemon(d, signal.SIGCONT)
            signal_daemon(d, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for d in daemons:
            if d.proc is None:
                continue
            try:  # not Daemon.stop: a second SIGTERM would cut a clean stop short
                d.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d.kill()

    def exited(self) -> list[str]:
        """Daemons that died on their own (a crash the scenario did not cause)."""
        return [
            f"{d.name} exited with {d.proc.returncode}: {d.tail()}"
            for r in self.regions.values()
            for d in r.daemons.values()
            if d.proc is not None and d.proc.poll() is not None
        ]
