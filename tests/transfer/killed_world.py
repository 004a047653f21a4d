"""The world of the SIGKILL transfer tests: real `meridian agent serve` processes
(tests/harness/agent_process.py) on the stack's etcd, with the harness's world policy
plus one capped dataset, `slow/*` (standard, eu-west -> eu-central, EU only, 6 MiB/s per
link), so that a Sync lasts long enough to be killed in its middle."""

from __future__ import annotations

from pathlib import Path

from harness.agent_fixtures import clear_keyspace
from harness.agent_process import prepare_world, world_policy
from harness.controllers import run_cli

RATE = 6 << 20  # bytes/s: the link cap of `slow/*`
DATASET = "slow/run"

SLOW_POLICY = """\
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: slow
spec:
  selector:
    datasets: ["slow/*"]
  class: standard
  home: eu-west
  replicas:
    regions: [eu-central]
  residency: [EU]
  rpo: 30s
  failover:
    mode: manual
  transfer:
    bandwidth: 6MiB/s
"""


def slow_world(folder: Path, etcd: str) -> dict[str, str]:
    """A fresh keyspace with the world and `slow/*` applied and published; returns the
    environment for `meridian` (a SQLite catalog in `folder`)."""
    clear_keyspace(etcd)
    env = prepare_world(folder, etcd)
    policy = folder / "slow-policy.yaml"
    policy.write_text(world_policy() + SLOW_POLICY, encoding="utf-8")
    done = run_cli(["policy", "apply", str(policy), "--yes"], env)
    if done.returncode != 0:
        raise RuntimeError(f"meridian policy apply failed: {done.stderr.strip()}")
    return env
