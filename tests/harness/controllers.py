"""Harness for real-process controller tests and the failover benchmark.

Writes a policy with N critical datasets, applies it to a catalog through the
`meridian` CLI (so the tests go through the same doors as users), and runs
`meridian controller run` as separate processes that can be SIGKILLed, SIGSTOPped
and resumed. The failover benchmark imports it too (through `benchmarks/bench_harness.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.children import ChildProcess, log_events, popen_logged

REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"), ("us-east", "US")]


def meridian_argv() -> list[str]:
    script = Path(sys.executable).with_name("meridian")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from controlplane.cli.main import entry; entry()"]


def policy_yaml(datasets: int, *, manual: int = 1) -> str:
    """A topology of four regions; `datasets` critical ckpt/dNNN homed in eu-west
    (failover order eu-central, eu-north), and `manual` ones in manual failover mode."""
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    head = "apiVersion: meridian/v1\nkind: Topology\nmetadata:\n  name: test\n"
    docs = [f"{head}spec:\n  regions:\n{regions}\n"]
    for name, glob, mode in (
        ("checkpoints", "ckpt/*", "automatic"),
        ("pinned", "pinned/*", "manual"),
    ):
        docs.append(
            "apiVersion: meridian/v1\nkind: ReplicationPolicy\n"
            f'metadata:\n  name: {name}\nspec:\n  selector:\n    datasets: ["{glob}"]\n'
            "  class: critical\n  home: eu-west\n"
            "  replicas:\n    regions: [eu-central, eu-north]\n"
            "  residency: [EU]\n  rpo: 0s\n"
            f"  failover:\n    mode: {mode}\n    order: [eu-central, eu-north]\n"
        )
    names = [f"ckpt/d{i:03d}" for i in range(datasets)] + [f"pinned/p{i}" for i in range(manual)]
    for ds in names:
        docs.append(f"apiVersion: meridian/v1\nkind: Dataset\nmetadata:\n  name: {ds}\n")
    return "---\n".join(docs)


def run_cli(
    args: list[str], env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*meridian_argv(), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def apply_world(folder: Path, env: dict[str, str], policy: str) -> dict[str, str]:
    """Migrate `env`'s catalog and apply `policy` (written to folder/policy.yaml), which
    publishes it to etcd, through the CLI as a user would; returns `env`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "policy.yaml"
    path.write_text(policy, encoding="utf-8")
    for args in (["db", "upgrade"], ["policy", "apply", str(path), "--yes"]):
        done = run_cli(args, env)
        if done.returncode != 0:
            raise RuntimeError(f"meridian {' '.join(args)} failed: {done.stderr.strip()}")
    return env


def prepare_catalog(
    folder: Path, etcd: list[str], datasets: int, *, manual: int = 1
) -> dict[str, str]:
    """A migrated SQLite catalog with the policy applied and published; returns the env."""
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": ",".join(etcd),
        "MERIDIAN_HOME": str(folder / "home"),
    }
    return apply_world(folder, env, policy_yaml(datasets, manual=manual))


@dataclass
class ControllerProcess(ChildProcess):
    """One `meridian controller run` in its own process (and session)."""

    region: str
    env: dict[str, str]
    log_path: Path
    fence_dir: Path | None = None
    lease_ttl_s: int = 5
    controller_id: str = ""
    metrics_addr: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    stop_timeout_s = 10  # not a field: ChildProcess.stop's default here

    def start(self) -> ControllerProcess:
        args = [*meridian_argv(), "controller", "run", "--region", self.region]
        args += ["--id", self.controller_id or f"{self.region}-{time.monotonic_ns()}"]
        args += ["--lease-ttl", str(self.lease_ttl_s)]
        if self.fence_dir is not None:
            args += ["--fence-dir", str(self.fence_dir)]
        if self.metrics_addr is not None:
            args += ["--metrics", self.metrics_addr]
        self.proc = popen_logged(args, self.env, self.log_path)
        return self

    def events(self) -> list[dict[str, object]]:
        if not self.log_path.exists():
            return []
        return log_events(self.log_path.read_text(encoding="utf-8", errors="replace"))

    def has_event(self, name: str) -> bool:
        return any(e.get("event") == name for e in self.events())
