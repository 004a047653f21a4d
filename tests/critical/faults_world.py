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
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from critical_helpers import critical_policy_doc, put, topology_doc
from harness.agent_process import AgentProcess
from harness.controllers import ControllerProcess, apply_world, run_cli
from harness.ports import free_port
from waiting import WaitTimeoutError, until

from chaos.toxiproxy import AsyncToxiproxy
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Owner, Ownership
from meridian.v1 import agent_pb2, agent_pb2_grpc

EU = ("eu-west", "eu-central", "eu-north")
# The regions' and agents' leases. Long enough that a loaded machine (CI runs on two
# cores) does not let a live controller's lease lapse between keepalives: with 2 s one
# did, 2.3 s into its term, and an automatic failover moved every dataset off eu-west
# in the middle of the partition test. The tests that need a failover (a paused and a
# killed owner region) wait about one TTL more for it.
LEASE_TTL_S = 4


def faults_policy(datasets: list[str]) -> str:
    text = topology_doc("faults")
    for name, ack in (("auto", "quorum"), ("strict", "all")):
        text += critical_policy_doc(
            name, f"{name}/*", EU[1:], ack, failover="automatic", order=EU[1:]
        )
    for ds in datasets:
        text += f"---\napiVersion: meridian/v1\nkind: Dataset\nmetadata:\n  name: {ds}\n"
    return text


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
        await asyncio.to_thread(apply_world, self.folder, self.env, faults_policy(datasets))
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
        try:
            await asyncio.gather(
                *(asyncio.to_thread(c.stop) for c in self.controllers.values()),
                *(asyncio.to_thread(a.stop) for a in self.agents.values() if a.running),
            )
        finally:  # a process that would not stop must not leave the proxies behind too
            async with AsyncToxiproxy(self.toxiproxy_url) as tp:
                for name in self.proxies.values():
                    with contextlib.suppress(Exception):  # best effort at teardown
                        await tp.delete_proxy(name)

    async def partition(self, region: str, cut: bool) -> None:
        """Refuse (or heal) every connection to `region`'s agent from the others; returns
        once a call through the proxy is refused (or answered) as it should be."""
        async with AsyncToxiproxy(self.toxiproxy_url) as tp:
            await tp.set_enabled(self.proxies[region], not cut)
        route = dict(p.split("=", 1) for p in self.env["MERIDIAN_AGENT_ROUTES"].split(","))

        async def as_asked() -> bool:
            try:
                async with grpc.aio.insecure_channel(route[region]) as channel:
                    await agent_pb2_grpc.AgentStub(channel).Health(
                        agent_pb2.HealthRequest(), timeout=1
                    )
                reached = True
            except grpc.aio.AioRpcError:
                reached = False
            return reached != cut

        await until(as_asked, 10, what=f"the proxy of {region} to {'cut' if cut else 'heal'}")

    def cli(self, *args: str, timeout_s: float = 150) -> tuple[int, str, str]:
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
    """The owner record once `check` holds of it (bounded)."""
    last: list[Owner | None] = [None]

    async def checked() -> Owner | None:
        last[0] = await owner_of(coord, dataset)
        return last[0] if last[0] is not None and check(last[0]) else None

    return await until(
        checked, timeout_s, what=f"the owner of {dataset} to pass the check", detail=lambda: last[0]
    )


async def wait_alive(
    coord: EtcdCoordination, regions: tuple[str, ...], timeout_s: float = 30
) -> None:
    """Until every region of `regions` has a live controller (its liveness key)."""

    async def all_alive() -> bool:
        return all([await coord.get(keys.alive(r)) is not None for r in regions])

    await until(all_alive, timeout_s, what=f"a live controller in each of {regions}")


async def raw_put(
    address: str,
    dataset: str,
    key: str,
    data: bytes,
    *,
    channel: grpc.aio.Channel | None = None,
) -> agent_pb2.PutResponse:
    """critical_helpers.put with the fault tests' 15 s bound."""
    return await put(address, dataset, key, data, timeout_s=15, channel=channel)


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
        deadline = time.monotonic() + max_s
        for i in range(max_writes):
            if self._stop.is_set() or time.monotonic() >= deadline:
                return
            found = await self._serving_owner(deadline)
            if found is None:
                return
            owner, agent = found
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
                # A refusal: back off a moment, then ask etcd for the owner again. Nothing
                # to await instead: the next attempt is what tells whether it takes.
                await asyncio.sleep(0.02)
                continue
            self.acked.append(
                Acked(key, data, resp.version.digest, owner.region, tuple(resp.regions))
            )

    async def _serving_owner(self, deadline: float) -> tuple[Owner, AgentProcess] | None:
        """The owner and its agent once that agent serves; None once stopped or out of time."""

        async def serving() -> tuple[Owner, AgentProcess] | bool:
            if self._stop.is_set():
                return True
            owner = await owner_of(self.coord, self.dataset)
            agent = self.world.agents.get(owner.region) if owner else None
            if owner is None or agent is None or not agent.running or not agent.address:
                return False
            return owner, agent

        try:
            found = await until(
                serving,
                max(0.0, deadline - time.monotonic()),
                what=f"a serving owner of {self.dataset}",
            )
        except WaitTimeoutError:
            return None
        return None if found is True else found  # type: ignore[return-value]

    async def until(self, pred: Callable[[], bool], timeout_s: float = 30) -> None:
        """Wait (bounded) until `pred()` holds while the writer runs."""
        await until(
            pred,
            timeout_s,
            what="the writer's condition",
            detail=lambda: f"{len(self.acked)} acked, refused {self.refused}",
        )


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
