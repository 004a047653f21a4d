"""A world for the critical-dataset tests: four regions (eu-west, eu-central, eu-north
in EU, us-east in US) and critical policies homed in eu-west:

* `pair/*`: one replica (eu-central), `ack: quorum` = 2 of 2;
* `tri/*`: two replicas (eu-central, eu-north), `ack: quorum` = 2 of 3;
* `every/*`: two replicas, `ack: all` = 3 of 3;
* `plain/*`: standard, acked after the local commit (the benchmark's baseline).

Agents are real `meridian agent serve` processes (harness.agent_process), owners are
claimed in etcd as a controller would (Ownership.claim), writes go through the raw
gRPC API so that the response's `regions` can be checked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from harness.controllers import run_cli

from meridian.v1 import agent_pb2, agent_pb2_grpc

REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"), ("us-east", "US")]


def _policy(name: str, glob: str, replicas: list[str], ack: str) -> str:
    return f"""\
---
apiVersion: meridian/v1
kind: ReplicationPolicy
metadata:
  name: {name}
spec:
  selector:
    datasets: ["{glob}"]
  class: critical
  home: eu-west
  replicas:
    regions: [{", ".join(replicas)}]
  residency: [EU]
  rpo: 0s
  ack: {ack}
  failover:
    mode: manual
"""


def critical_policy() -> str:
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    topology = f"""\
apiVersion: meridian/v1
kind: Topology
metadata:
  name: critical
spec:
  regions:
{regions}
  links:
    - between: [eu-west, eu-central]
      rtt: 12ms
    - between: [eu-west, eu-north]
      rtt: 20ms
"""
    return (
        topology
        + _policy("pair", "pair/*", ["eu-central"], "quorum")
        + _policy("tri", "tri/*", ["eu-central", "eu-north"], "quorum")
        + _policy("every", "every/*", ["eu-central", "eu-north"], "all")
        + _policy("plain", "plain/*", ["eu-central"], "quorum")
        .replace("class: critical", "class: standard")
        .replace("rpo: 0s", "rpo: 30s")
        .replace("  ack: quorum\n", "")
    )


def prepare_critical_world(folder: Path, etcd: str) -> dict[str, str]:
    """Migrate a SQLite catalog, apply and publish the policy; the `meridian` env."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": etcd,
        "MERIDIAN_HOME": str(folder / "home"),
    }
    policy = folder / "policy.yaml"
    policy.write_text(critical_policy(), encoding="utf-8")
    for args in (["db", "upgrade"], ["policy", "apply", str(policy), "--yes"]):
        done = run_cli(args, env)
        if done.returncode != 0:
            raise RuntimeError(f"meridian {' '.join(args)} failed: {done.stderr.strip()}")
    return env


async def put(
    address: str, dataset: str, key: str, data: bytes, *, timeout_s: float = 30
) -> agent_pb2.PutResponse:
    """One Put through the raw API (header, 1 MiB chunks, end)."""

    async def frames() -> object:
        yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=dataset, key=key))
        for at in range(0, len(data), 1 << 20):
            yield agent_pb2.PutRequest(chunk=data[at : at + (1 << 20)])
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        return await stub.Put(frames(), timeout=timeout_s)  # type: ignore[arg-type]


async def stat(address: str, dataset: str, key: str) -> agent_pb2.ObjectInfo | None:
    """The newest version `address` holds of dataset/key (None when none)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        try:
            got = await stub.Stat(agent_pb2.StatRequest(dataset=dataset, key=key), timeout=10)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return got.object


async def wait_stat_digest(
    address: str, dataset: str, key: str, digest: str, timeout_s: float = 15
) -> bool:
    """Whether `address` comes to hold dataset/key at `digest` within the time (polled
    every 50 ms, bounded)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    for _ in range(int(timeout_s / 0.05) + 1):
        found = await stat(address, dataset, key)
        if found is not None and found.version.digest == digest:
            return True
        if loop.time() >= until:
            break
        await asyncio.sleep(0.05)
    return False
