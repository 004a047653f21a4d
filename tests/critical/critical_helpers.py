"""A world for the critical-dataset tests: four regions (eu-west, eu-central, eu-north
in EU, us-east in US) and critical policies homed in eu-west:

* `pair/*`: one replica (eu-central), `ack: quorum` = 2 of 2;
* `tri/*`: two replicas (eu-central, eu-north), `ack: quorum` = 2 of 3;
* `every/*`: two replicas, `ack: all` = 3 of 3;
* `plain/*`: standard, acked after the local commit (the benchmark's baseline).

Agents are real `meridian agent serve` processes (harness.agent_process), owners are
claimed in etcd as a controller would (Ownership.claim), writes go through the raw
gRPC API so that the response's `regions` can be checked.

The parts both critical worlds use (this one and faults_world's) live here: the
regions, the documents of a topology and of a critical policy, and the raw Put and
Stat calls."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import grpc
from harness.agent_process import AgentProcess
from harness.controllers import apply_world
from waiting import WaitTimeoutError, until

from agents.replication.early_status import core_internal
from meridian.v1 import agent_pb2, agent_pb2_grpc

HIDDEN_ATTEMPTS = 5  # the same Put, made again while grpc aio hides the agent's status


def wait_ready(procs: Iterable[AgentProcess], timeout_s: float = 60) -> dict[str, str]:
    """Wait for each spawned agent's `agent_ready` (spawned together, waited for
    together) and set its address; returns each agent's id by its address."""
    ids: dict[str, str] = {}
    for proc in procs:
        event = proc.wait_event("agent_ready", timeout_s)
        assert event is not None, proc.log_tail()
        proc.address = str(event["endpoint"])
        ids[proc.address] = str(event["id"])
    return ids


def kill_all(procs: Iterable[AgentProcess]) -> None:
    """SIGKILL every agent still running (continued first: a test may have paused one)."""
    for proc in procs:
        if proc.running:
            proc.signal(signal.SIGCONT)
            proc.kill()


REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"), ("us-east", "US")]


def topology_doc(name: str, links: Sequence[tuple[str, str, str]] = ()) -> str:
    """The Topology of REGIONS, with `links` (region, region, rtt) when given."""
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    text = f"apiVersion: meridian/v1\nkind: Topology\nmetadata:\n  name: {name}\nspec:\n"
    text += f"  regions:\n{regions}\n"
    if links:
        text += "  links:\n" + "".join(
            f"    - between: [{a}, {b}]\n      rtt: {rtt}\n" for a, b, rtt in links
        )
    return text


def critical_policy_doc(
    name: str,
    glob: str,
    replicas: Sequence[str],
    ack: str,
    *,
    failover: str = "manual",
    order: Sequence[str] = (),
) -> str:
    """A critical ReplicationPolicy homed in eu-west, residency EU (a `---` document)."""
    text = f"""\
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
    mode: {failover}
"""
    if order:
        text += f"    order: [{', '.join(order)}]\n"
    return text


def critical_policy() -> str:
    topology = topology_doc(
        "critical", [("eu-west", "eu-central", "12ms"), ("eu-west", "eu-north", "20ms")]
    )
    return (
        topology
        + critical_policy_doc("pair", "pair/*", ["eu-central"], "quorum")
        + critical_policy_doc("tri", "tri/*", ["eu-central", "eu-north"], "quorum")
        + critical_policy_doc("every", "every/*", ["eu-central", "eu-north"], "all")
        + critical_policy_doc("plain", "plain/*", ["eu-central"], "quorum")
        .replace("class: critical", "class: standard")
        .replace("rpo: 0s", "rpo: 30s")
        .replace("  ack: quorum\n", "")
    )


def prepare_critical_world(folder: Path, etcd: str) -> dict[str, str]:
    """Migrate a SQLite catalog, apply and publish the policy; the `meridian` env."""
    env = {
        "MERIDIAN_CATALOG": f"sqlite:///{folder / 'catalog.db'}",
        "MERIDIAN_ETCD": etcd,
        "MERIDIAN_HOME": str(folder / "home"),
    }
    return apply_world(folder, env, critical_policy())


async def put(
    address: str,
    dataset: str,
    key: str,
    data: bytes,
    *,
    timeout_s: float = 30,
    channel: grpc.aio.Channel | None = None,
    epoch: int | None = None,
) -> agent_pb2.PutResponse:
    """One Put through the raw API (header, 1 MiB chunks, end), on `channel` when given,
    else on a channel of its own; at `epoch` when given (else the agent attaches its own)."""

    async def frames() -> object:
        header = agent_pb2.PutHeader(dataset=dataset, key=key, epoch=epoch)
        yield agent_pb2.PutRequest(header=header)
        for at in range(0, len(data), 1 << 20):
            yield agent_pb2.PutRequest(chunk=data[at : at + (1 << 20)])
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    async def asked(on: grpc.aio.Channel) -> agent_pb2.PutResponse:
        # A refusal at the header can reach a stub still sending as INTERNAL "Internal
        # error from Core" (grpc/grpc#36066): the agent ended the call before our end
        # frame, so it stored nothing, and the same Put is made again (bounded).
        for attempt in range(1, HIDDEN_ATTEMPTS + 1):
            try:
                return await agent_pb2_grpc.AgentStub(on).Put(frames(), timeout=timeout_s)  # type: ignore[arg-type]
            except grpc.aio.AioRpcError as err:
                if not core_internal(err) or attempt == HIDDEN_ATTEMPTS:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    if channel is not None:
        return await asked(channel)
    async with grpc.aio.insecure_channel(address) as own:
        return await asked(own)


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
    """Whether `address` comes to hold dataset/key at `digest` within the time."""

    async def holds() -> bool:
        found = await stat(address, dataset, key)
        return found is not None and found.version.digest == digest

    try:
        return await until(holds, timeout_s, what=f"{address} to hold {dataset}/{key}@{digest}")
    except WaitTimeoutError:
        return False


@contextlib.contextmanager
def running_agents(tmp_path: Path, env: dict[str, str]) -> Iterator[dict[str, AgentProcess]]:
    """One started agent per EU region with `env`, stopped (or killed) after."""
    procs = {
        r: AgentProcess(r, tmp_path / r, env, tmp_path / f"{r}.log", metrics=True)
        for r in ("eu-west", "eu-central", "eu-north")
    }
    try:
        for proc in procs.values():
            proc.start()
        yield procs
    finally:
        for proc in procs.values():
            if proc.running:
                proc.kill() if proc.proc is not None and _stopped(proc) else proc.stop()


def _stopped(proc: AgentProcess) -> bool:
    """A SIGSTOPped process cannot handle SIGTERM; kill it instead."""
    try:
        state = Path(f"/proc/{proc.pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state == "T"
