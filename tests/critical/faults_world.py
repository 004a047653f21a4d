"""A world of real processes for the critical fault tests (tests/critical/test_faults_*.py).

Three EU regions (eu-west, eu-central, eu-north; us-east exists in the topology
only), each with a `meridian agent serve` and a `meridian controller run` process,
on a clean etcd keyspace and a SQLite catalog. Every agent is reached by the
others through a Toxiproxy proxy of its own (`MERIDIAN_AGENT_ROUTES`, given to
agents, controllers and the CLI alike), so a test can partition a region's agent
from the rest. Critical datasets homed in eu-west, replicas eu-central and
eu-north, failover order [eu-central, eu-north]:

* `auto/*`: `ack: quorum` (2 of 3), automatic failover;
* `strict/*`: `ack: all` (3 of 3), automatic failover.

`Writer` is the load: sequential acked writes of fresh keys through whichever
region etcd names as the owner, following it across moves, bounded in count and
time; it keeps every acked write (key, bytes, digest, acking region) to check.
Every wait here is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from harness.agent_process import AgentProcess
from harness.controllers import ControllerProcess, run_cli

from chaos.toxiproxy import AsyncToxiproxy
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Owner, Ownership
from meridian.v1 import agent_pb2, agent_pb2_grpc

EU = ("eu-west", "eu-central", "eu-north")
REGIONS = [("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"), ("us-east", "US")]
LEASE_TTL_S = 2


def _policy(name: str, glob: str, ack: str) -> str:
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
    regions: [eu-central, eu-north]
  residency: [EU]
  rpo: 0s
  ack: {ack}
  failover:
    mode: automatic
    order: [eu-central, eu-north]
"""


def faults_policy(datasets: list[str]) -> str:
    regions = "\n".join(f"    - name: {n}\n      jurisdiction: {j}" for n, j in REGIONS)
    text = (
        "apiVersion: meridian/v1\nkind: Topology\nmetadata:\n  name: faults\nspec:\n"
        f"  regions:\n{regions}\n"
    )
    text += _policy("auto", "auto/*", "quorum") + _policy("strict", "strict/*", "all")
    for ds in datasets:
        text += f"---\napiVersion: meridian/v1\nkind: Dataset\nmetadata:\n  name: {ds}\n"
    return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@dataclass
class FaultsWorld:
    folder: Path
    etcd: str
    toxiproxy_url: str
    env: dict[str, str] = field(default_factory=dict)
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    controllers: dict[str, ControllerProcess] = field(default_factory=dict)
    proxies: dict[str, str] = field(default_factory=dict)  # region -> proxy name
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    async def start(self, datasets: list[str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        ports = {r: free_port() for r in EU}
        listen = {r: free_port() for r in EU}
        async with AsyncToxiproxy(self.toxiproxy_url) as tp:
            for r in EU:
                name = f"critb-{r}-{self.tag}"
                await tp.create_proxy(name, f"127.0.0.1:{listen[r]}", f"127.0.0.1:{ports[r]}")
                self.proxies[r] = name
        routes = ",".join(f"{r}=127.0.0.1:{listen[r]}" for r in EU)
        self.env = {
            "MERIDIAN_CATALOG": f"sqlite:///{self.folder / 'catalog.db'}",
            "MERIDIAN_ETCD": self.etcd,
            "MERIDIAN_HOME": str(self.folder / "home"),
            "MERIDIAN_AGENT_ROUTES": routes,
        }
        policy = self.folder / "policy.yaml"
        policy.write_text(faults_policy(datasets), encoding="utf-8")
        for args in (["db", "upgrade"], ["policy", "apply", str(policy), "--yes"]):
            done = await asyncio.to_thread(run_cli, args, self.env)
            if done.returncode != 0:
                raise RuntimeError(f"meridian {' '.join(args)} failed: {done.stderr.strip()}")
        for r in EU:
            self.agents[r] = AgentProcess(
                r,
                self.folder / r,
                self.env,
                self.folder / f"{r}.agent.log",
                metrics=True,
                port=ports[r],
                lease_ttl_s=LEASE_TTL_S,
            )
            self.controllers[r] = ControllerProcess(
                r, self.env, self.folder / f"{r}.controller.log", lease_ttl_s=LEASE_TTL_S
            )
        # A loaded machine can take long to start a Python process: allow for it.
        await asyncio.gather(*(asyncio.to_thread(a.start, 90) for a in self.agents.values()))
        for c in self.controllers.values():
            c.start()

    async def stop(self) -> None:
        # All at once (SIGCONT first, so a paused one stops too): each may take seconds.
        await asyncio.gather(
            *(asyncio.to_thread(c.stop) for c in self.controllers.values()),
            *(asyncio.to_thread(a.stop) for a in self.agents.values() if a.running),
        )
        async with AsyncToxiproxy(self.toxiproxy_url) as tp:
            for name in self.proxies.values():
                with contextlib.suppress(Exception):  # best effort at teardown
                    await tp.delete_proxy(name)

    async def partition(self, region: str, cut: bool) -> None:
        """Refuse (or heal) every connection to `region`'s agent from the others."""
        async with AsyncToxiproxy(self.toxiproxy_url) as tp:
            await tp.set_enabled(self.proxies[region], not cut)

    def cli(self, *args: str, timeout_s: float = 60) -> tuple[int, str, str]:
        done = run_cli(list(args), self.env, timeout_s=timeout_s)
        return done.returncode, done.stdout, done.stderr


async def owner_of(coord: EtcdCoordination, dataset: str) -> Owner | None:
    return await Ownership(coord).get(dataset)


async def wait_owner(
    coord: EtcdCoordination,
    dataset: str,
    check: Callable[[Owner], bool],
    timeout_s: float = 30,
) -> Owner:
    """The owner record once `check` holds of it (polled every 50 ms, bounded)."""
    until = time.monotonic() + timeout_s
    last: Owner | None = None
    for _ in range(int(timeout_s / 0.05) + 1):
        last = await owner_of(coord, dataset)
        if last is not None and check(last):
            return last
        if time.monotonic() >= until:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"owner of {dataset} never satisfied the check (last: {last})")


async def wait_alive(
    coord: EtcdCoordination, regions: tuple[str, ...], timeout_s: float = 30
) -> None:
    """Until every region of `regions` has a live controller (its liveness key)."""
    until = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.05) + 1):
        found = [r for r in regions if await coord.get(keys.alive(r)) is not None]
        if len(found) == len(regions):
            return
        if time.monotonic() >= until:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"regions {regions} not all alive after {timeout_s} s")


async def raw_put(
    address: str,
    dataset: str,
    key: str,
    data: bytes,
    *,
    channel: grpc.aio.Channel | None = None,
) -> agent_pb2.PutResponse:
    """One Put through the raw API (on `channel` when given, else a channel of its own)."""

    async def frames() -> object:
        yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=dataset, key=key))
        yield agent_pb2.PutRequest(chunk=data)
        yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())

    if channel is not None:
        return await agent_pb2_grpc.AgentStub(channel).Put(frames(), timeout=15)  # type: ignore[arg-type]
    async with grpc.aio.insecure_channel(address) as own:
        return await agent_pb2_grpc.AgentStub(own).Put(frames(), timeout=15)  # type: ignore[arg-type]


async def raw_gets(address: str, dataset: str, keys: list[str]) -> dict[str, bytes]:
    """The newest bytes of each of `keys` (one channel, a few reads at a time)."""
    out: dict[str, bytes] = {}
    gate = asyncio.Semaphore(8)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)

        async def one(key: str) -> None:
            async with gate:
                got = bytearray()
                req = agent_pb2.GetRequest(dataset=dataset, key=key)
                async for msg in stub.Get(req, timeout=15):
                    if msg.HasField("chunk"):
                        got += msg.chunk
                out[key] = bytes(got)

        await asyncio.gather(*(one(k) for k in keys))
    return out


async def listing(address: str, dataset: str) -> dict[str, str]:
    """key -> digest of the newest version `address` holds."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        out: dict[str, str] = {}
        token = ""
        for _page in range(1000):
            page = await stub.List(
                agent_pb2.ListRequest(dataset=dataset, page_token=token, page_size=1000),
                timeout=15,
            )
            out.update({o.key: o.version.digest for o in page.objects})
            token = page.next_page_token
            if not token:
                break
        return out


@dataclass
class Acked:
    key: str
    data: bytes
    digest: str
    region: str  # the owner that acked it
    regions: tuple[str, ...]


@dataclass
class Writer:
    """Sequential acked writes to `dataset` through its current owner (see module doc)."""

    world: FaultsWorld
    coord: EtcdCoordination
    dataset: str
    acked: list[Acked] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # gRPC code name -> count
    attempts: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    async def run(self, *, max_writes: int = 400, max_s: float = 60) -> None:
        channels: dict[str, grpc.aio.Channel] = {}
        try:
            await self._run(channels, max_writes, max_s)
        finally:
            for channel in channels.values():
                await channel.close()

    async def _run(
        self, channels: dict[str, grpc.aio.Channel], max_writes: int, max_s: float
    ) -> None:
        until = time.monotonic() + max_s
        for i in range(max_writes):
            if self._stop.is_set() or time.monotonic() >= until:
                return
            owner = await owner_of(self.coord, self.dataset)
            agent = self.world.agents.get(owner.region) if owner else None
            if agent is None or not agent.running or not agent.address:
                await asyncio.sleep(0.05)
                continue
            key = f"w{i:05d}"
            data = hashlib.sha256(f"{self.dataset} {key}".encode()).digest() * (64 + i % 64)
            self.attempts += 1
            try:
                if agent.address not in channels:
                    channels[agent.address] = grpc.aio.insecure_channel(agent.address)
                resp = await raw_put(
                    agent.address, self.dataset, key, data, channel=channels[agent.address]
                )
            except grpc.aio.AioRpcError as err:
                code = err.code().name
                self.refused[code] = self.refused.get(code, 0) + 1
                await asyncio.sleep(0.02)  # a refusal: ask etcd for the owner again
                continue
            self.acked.append(
                Acked(key, data, resp.version.digest, owner.region, tuple(resp.regions))
            )

    async def until(self, pred: Callable[[], bool], timeout_s: float = 30) -> None:
        """Wait (bounded) until `pred()` holds while the writer runs."""
        until = time.monotonic() + timeout_s
        for _ in range(int(timeout_s / 0.05) + 1):
            if pred():
                return
            if time.monotonic() >= until:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(f"writer condition not met in {timeout_s} s ({len(self.acked)} acked)")


async def bounded(what: str, coro: Awaitable[object], timeout_s: float) -> None:
    try:
        await asyncio.wait_for(coro, timeout_s)
    except TimeoutError:
        raise AssertionError(f"{what} did not finish in {timeout_s} s") from None


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of samples of `name` whose labels include `labels`, in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
