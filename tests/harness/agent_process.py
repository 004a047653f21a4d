"""Real `meridian agent serve` processes for tests, benchmarks and chaos.

    env = prepare_world(tmp_path / "world", etcd_endpoint, catalog_url)
    agent = AgentProcess("eu-west", tmp_path / "eu-west", env, tmp_path / "eu-west.log")
    agent.start()               # waits until it answers Health; agent.address is host:port
    ...
    agent.stop()                # SIGTERM; returns the exit status (0 for a clean stop)
    agent.kill()                # SIGKILL
    agent.start()               # again, on the same root (a new port unless `port` is set)

The agent listens on port 0 (the OS picks a free one, so parallel tests never
collide) and logs the endpoint it got in its `agent_ready` event, which `start`
reads. `prepare_world` migrates a catalog, and applies a policy (through the
`meridian` CLI, as a user would) that publishes it to etcd: three regions (eu-west
and eu-central in EU, us-east in US) and four policies:

* `corpus/*`: standard, home eu-west, residency EU and US (copies anywhere);
* `eu/*`: standard, home eu-west, replicas eu-central, residency EU only;
* `ckpt/*`: critical, home eu-west, replica eu-central, residency EU;
* nothing else is governed (writes to other datasets are refused: fail closed).

Every wait here is bounded in time and in count.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from waiting import WaitTimeoutError, until_sync

from harness.children import ChildProcess, log_events, popen_logged
from harness.controllers import apply_world, meridian_argv
from meridian.v1 import agent_pb2, agent_pb2_grpc

WORLD_REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("us-east", "US")]

WORLD_POLICY = """\
apiVersion: meridian/v1
kind: Topology
metadata:
  name: agents
spec:
  regions:
{regions}
  links:
    - between: [eu-west, eu-central]
      rtt: 12ms
    - between: [eu-west, us-east]
      rtt: 80ms
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: corpus
spec:
  selector:
    datasets: ["corpus/*"]
  class: standard
  home: eu-west
  replicas:
    regions: [eu-central, us-east]
  residency: [EU, US]
  rpo: 30s
  failover:
    mode: manual
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: eu-only
spec:
  selector:
    datasets: ["eu/*"]
  class: standard
  home: eu-west
  replicas:
    regions: [eu-central]
  residency: [EU]
  rpo: 30s
  failover:
    mode: manual
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: checkpoints
spec:
  selector:
    datasets: ["ckpt/*"]
  class: critical
  home: eu-west
  replicas:
    regions: [eu-central]
  residency: [EU]
  rpo: 0s
  ack: all
  failover:
    mode: manual
"""


def world_policy() -> str:
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in WORLD_REGIONS)
    return WORLD_POLICY.format(regions=regions)


def prepare_world(
    folder: Path, etcd: str, catalog_url: str | None = None, kafka: str | None = None
) -> dict[str, str]:
    """Migrate the catalog (a SQLite file in `folder` unless `catalog_url` is given), apply
    the world policy and publish it to `etcd`; returns the environment for `meridian`
    (with `kafka` as MERIDIAN_KAFKA when given: the agents' outbox drains there)."""
    env = {
        "MERIDIAN_CATALOG": catalog_url or f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": etcd,
        "MERIDIAN_HOME": str(folder / "home"),
    }
    if kafka is not None:
        env["MERIDIAN_KAFKA"] = kafka
    return apply_world(folder, env, world_policy())


class AgentStartError(RuntimeError):
    """The agent exited, or did not answer Health, within the start timeout."""


@dataclass
class AgentProcess(ChildProcess):
    """One `meridian agent serve` in its own process (and session)."""

    region: str
    root: Path
    env: dict[str, str]
    log_path: Path
    metrics: bool = False
    port: int = 0  # 0: the OS chooses at every start
    lease_ttl_s: int = 5
    grace_s: float | None = None
    extra_args: list[str] = field(default_factory=list)
    address: str = ""
    metrics_address: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)

    # -- starting ------------------------------------------------------------------------
    def argv(self) -> list[str]:
        args = [*meridian_argv(), "agent", "serve", "--region", self.region]
        args += ["--root", str(self.root), "--listen", f"127.0.0.1:{self.port}"]
        args += ["--lease-ttl", str(self.lease_ttl_s)]
        if self.metrics:
            args += ["--metrics", "127.0.0.1:0"]
        if self.grace_s is not None:
            args += ["--grace", str(self.grace_s)]
        return args + self.extra_args

    def spawn(self) -> AgentProcess:
        """Start the process and return at once (see `start` to wait until it serves)."""
        if self.running:
            raise RuntimeError(f"the agent of {self.region} is already running")
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.address = self.metrics_address = ""
        self.proc = popen_logged(self.argv(), self.env, self.log_path)
        return self

    def start(self, timeout_s: float = 30) -> AgentProcess:
        """Start and wait until it answers Health; `AgentStartError` (with its log)
        if it exits or does not answer in time."""
        self.spawn()
        deadline = time.monotonic() + timeout_s
        event = self.wait_event("agent_ready", timeout_s)
        if event is None:
            status = self.proc.poll() if self.proc else None
            self.kill()
            raise AgentStartError(
                f"agent {self.region} did not start (exit status {status}): {self.log_tail()}"
            )
        self.address = str(event["endpoint"])
        self.metrics_address = str(event.get("metrics") or "")
        self.wait_healthy(max(1.0, deadline - time.monotonic()))
        return self

    def wait_healthy(self, timeout_s: float = 10) -> agent_pb2.HealthResponse:
        last: Exception | None = None
        with grpc.insecure_channel(self.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)

            def answered() -> agent_pb2.HealthResponse | None:
                nonlocal last
                try:
                    resp: agent_pb2.HealthResponse = stub.Health(
                        agent_pb2.HealthRequest(), timeout=2
                    )
                    if resp.live:
                        return resp
                except grpc.RpcError as exc:
                    last = exc
                if not self.running:
                    raise AgentStartError(f"agent {self.region} exited: {last}")
                return None

            try:
                return until_sync(answered, timeout_s, f"agent {self.region} to answer Health")
            except WaitTimeoutError:
                pass
        raise AgentStartError(f"agent {self.region} at {self.address} did not answer: {last}")

    # -- stopping (ChildProcess: running, pid, signal, stop, kill) -------------------------
    def wait_exit(self, timeout_s: float = 30) -> int:
        if self.proc is None:
            raise RuntimeError("not started")
        return self.proc.wait(timeout_s)

    # -- the log ---------------------------------------------------------------------------
    def log_text(self, *, this_run: bool = True) -> str:
        if not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[self._log_offset if this_run else 0 :].decode("utf-8", "replace")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def events(self, *, this_run: bool = True) -> list[dict[str, object]]:
        return log_events(self.log_text(this_run=this_run))

    def event(self, name: str) -> dict[str, object] | None:
        return next((e for e in self.events() if e.get("event") == name), None)

    def wait_event(self, name: str, timeout_s: float) -> dict[str, object] | None:
        """The first event `name` of this run, waiting for it up to `timeout_s`; None if
        it did not come (or the process exited without it)."""
        try:
            until_sync(
                lambda: self.event(name) is not None or not self.running,
                timeout_s,
                f"event {name} from agent {self.region}",
            )
        except WaitTimeoutError:
            return None
        return self.event(name)
