"""A world for the read-through cache tests (issue 16): four regions, one policy.

`cached/*` is standard, home eu-west, replica eu-central (started with no agent, so
eu-west is the only holder), residency EU. eu-north and eu-south (EU) hold no replica
and read through their caches (eu-south's agent is given no Kafka: it cannot read the
change log); us-east (US) has a cache bound too but lies outside the residency.
The agents drain their outboxes to the stack's Kafka, which the caches read for
invalidations. Every wait here is bounded in time and count.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import waiting
from harness.controllers import run_cli

from meridian.v1 import agent_pb2, agent_pb2_grpc

CACHE_POLICY = """\
apiVersion: meridian/v1
kind: Topology
metadata:
  name: cache
spec:
  regions:
    - name: eu-west
      jurisdiction: EU
    - name: eu-central
      jurisdiction: EU
    - name: eu-north
      jurisdiction: EU
    - name: eu-south
      jurisdiction: EU
    - name: us-east
      jurisdiction: US
  links:
    - between: [eu-north, eu-central]
      rtt: 10ms
    - between: [eu-north, eu-west]
      rtt: 20ms
    - between: [eu-west, us-east]
      rtt: 80ms
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: cached
spec:
  selector:
    datasets: ["cached/*"]
  class: standard
  home: eu-west
  replicas:
    regions: [eu-central]
  residency: [EU]
  rpo: 30s
  failover:
    mode: manual
"""


def prepare_cache_world(folder: Path, etcd: str, kafka: str, cache: str) -> dict[str, str]:
    """Migrate a SQLite catalog in `folder`, apply the policy above; the environment of
    the world's processes (`cache` is MERIDIAN_REGION_CACHE)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": etcd,
        "MERIDIAN_KAFKA": kafka,
        "MERIDIAN_HOME": str(folder / "home"),
        "MERIDIAN_REGION_CACHE": cache,
    }
    policy = folder / "policy.yaml"
    policy.write_text(CACHE_POLICY, encoding="utf-8")
    for args in (["db", "upgrade"], ["policy", "apply", str(policy), "--yes"]):
        done = run_cli(args, env)
        if done.returncode != 0:
            raise RuntimeError(f"meridian {' '.join(args)} failed: {done.stderr.strip()}")
    return env


async def put(address: str, dataset: str, key: str, data: bytes) -> str:
    """Write an object through the agent at `address`; its version's HLC text."""

    async def frames() -> object:
        yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=dataset, key=key))
        for at in range(0, len(data), 1 << 20):
            yield agent_pb2.PutRequest(chunk=data[at : at + (1 << 20)])
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    async with grpc.aio.insecure_channel(address) as channel:
        response = await agent_pb2_grpc.AgentStub(channel).Put(frames(), timeout=60)
    return str(response.version.hlc)


async def get(address: str, dataset: str, key: str) -> tuple[str, bytes]:
    """The newest version's HLC text and bytes, read through the agent at `address`."""
    async with grpc.aio.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 8 << 20)]
    ) as channel:
        call = agent_pb2_grpc.AgentStub(channel).Get(
            agent_pb2.GetRequest(dataset=dataset, key=key), timeout=60
        )
        version, parts = "", []
        async for msg in call:
            if msg.WhichOneof("frame") == "header":
                version = msg.header.hlc
            else:
                parts.append(msg.chunk)
    return version, b"".join(parts)


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one Prometheus sample (`name{labels}`) in an exposition, 0 if absent."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until(
    check: Callable[[], object], timeout_s: float, what: str, *, poll_s: float = 0.1
) -> None:
    """Await `check()` (sync or async) until it is truthy, bounded (waiting.until)."""
    await waiting.until(check, timeout_s, what, step_s=poll_s)
