"""The data-plane workload and what the data-plane checkers read after a run.

`StandardWorkload`: single-threaded clients per region writing standard-class
objects through their own region's agent (`AgentClient`, the library every user
has) and reading them back. Each write's content is a per-key base block (so a
rewrite of a key is mostly the same bytes: the replicators' Fetch moves it as a
delta, a patch a crash can interrupt) stamped with the write's unique id; its
digest is computed here, independently of the agent, so a read that returns
anything but a whole written version is caught.

Outcomes: `ok` when the agent acknowledged the version; `fail` when the agent
refused it definitively before storing anything (residency, bad input, a
not-found); `info` otherwise (a timeout, a cut link, an agent killed mid-call:
the write may have taken effect).

After heal: `final_state` lists every agent's objects (the newest version per
key), `published_events` reads `meridian.changes` back from its start, and
`inventory` walks every agent's root for the residency checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.client import AgentClient
from chaos.history import EventType, History
from chaos.inventory import inventory_root
from chaos.records import Copy, ObjectState, PublishedEvent
from controlplane.adapters.kafka import CHANGES_TOPIC
from controlplane.domain.errors import MessageError
from controlplane.domain.version import ContentHasher
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError
from controlplane.logs import get_logger
from meridian.convert import decode_change_event

log = get_logger("meridian.chaos")

OP_TIMEOUT_S = 10.0
KEYS_PER_DATASET = 6  # few keys: concurrent writers from several regions meet on each


def digest_of(data: bytes) -> str:
    hasher = ContentHasher()
    hasher.update(data)
    return str(hasher.digest())


def content(seed: int, dataset: str, key: str, op_id: str, size: int) -> bytes:
    """`size` bytes: the key's base block (the same for every write of the key) with
    the write's id stamped at its start and its end."""
    base = hashlib.shake_256(f"{seed}/{dataset}/{key}".encode()).digest(max(size, 64))
    stamp = op_id.encode()
    return stamp + base[len(stamp) : size - len(stamp)] + stamp


def definite_refusal(exc: BaseException) -> bool:
    """The agent said no before it stored anything (the write can never take effect)."""
    from agents.errors import ResidencyError  # a refusal by policy is final

    return isinstance(exc, ResidencyError | InvalidInputError | NotFoundError)


class AgentClients:
    """One single-threaded client per region, each talking to its region's agent at
    `addresses[region]`, one operation per `interval_s`, until stopped."""

    role = "client"  # the clients' process names: `<region>/<role>`

    def __init__(
        self,
        addresses: Mapping[str, str],
        rng: random.Random,
        *,
        interval_s: float,
        op_timeout_s: float,
    ) -> None:
        self.addresses = dict(addresses)
        self.rng = rng
        self.interval_s = interval_s
        self.op_timeout_s = op_timeout_s
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for region, address in self.addresses.items():
            rng = random.Random(self.rng.getrandbits(64))  # noqa: S311 - replayable from the seed
            name = f"{region}/{self.role}"
            task = asyncio.create_task(self._client(region, address, name, rng), name=name)
            self._tasks.append(task)

    async def stop(self) -> None:
        self._stop.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.op_timeout_s * 2)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _client(self, region: str, address: str, name: str, rng: random.Random) -> None:
        async with AgentClient(address, timeout_s=self.op_timeout_s) as client:
            for _ in range(1_000_000):  # bounded; stopped long before
                if self._stop.is_set():
                    return
                await self.step(client, region, name, rng)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def step(self, client: AgentClient, region: str, name: str, rng: random.Random) -> None:
        raise NotImplementedError


class StandardWorkload(AgentClients):
    """One writer-reader client per region in `addresses` until stopped."""

    role = "data"

    def __init__(
        self,
        history: History,
        addresses: Mapping[str, str],
        datasets: Sequence[str],
        *,
        seed: int,
        size: int = 4096,
        interval_s: float = 0.05,
        read_ratio: float = 0.4,
        key_prefix: str = "",
    ) -> None:
        rng = random.Random(seed)  # noqa: S311 - replayable from the seed
        super().__init__(addresses, rng, interval_s=interval_s, op_timeout_s=OP_TIMEOUT_S)
        self.history = history
        self.datasets = list(datasets)
        self.seed = seed
        self.size = size
        self.read_ratio = read_ratio
        self.key_prefix = key_prefix  # a scenario's own objects on a shared world

    async def step(self, client: AgentClient, region: str, name: str, rng: random.Random) -> None:
        dataset = rng.choice(self.datasets)
        key = f"{self.key_prefix}k{rng.randrange(KEYS_PER_DATASET)}"
        if rng.random() < self.read_ratio:
            await self._read(client, region, name, dataset, key)
        else:
            await self._write(client, region, name, dataset, key)

    async def _write(
        self, client: AgentClient, region: str, name: str, dataset: str, key: str
    ) -> None:
        op_id = History.new_id("d")
        data = content(self.seed, dataset, key, op_id, self.size)
        digest = digest_of(data)
        inv = self.history.invoke(name, "write", region, dataset, key, op_id, digest=digest)

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 1 << 20):
                yield data[i : i + (1 << 20)]

        try:
            version = await asyncio.wait_for(
                client.put(dataset, key, chunks(), size=len(data)),
                OP_TIMEOUT_S * 2,
            )
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded
            outcome: EventType = "fail" if definite_refusal(exc) else "info"
            self.history.complete(inv, outcome, error=f"{type(exc).__name__}: {exc}"[:200])
            return
        if str(version.digest) != digest:
            self.history.complete(inv, "info", error=f"the agent stored digest {version.digest}")
            return
        self.history.complete(inv, "ok", version=str(version.hlc))

    async def _read(
        self, client: AgentClient, region: str, name: str, dataset: str, key: str
    ) -> None:
        inv = self.history.invoke(name, "read", region, dataset, key, None)
        try:
            _version, data = await asyncio.wait_for(
                client.get_bytes(dataset, key), OP_TIMEOUT_S * 2
            )
        except NotFoundError:
            self.history.complete(inv, "ok", absent=True)
            return
        except Exception as exc:  # noqa: BLE001 - a failed read changes nothing
            self.history.complete(inv, "fail", error=f"{type(exc).__name__}: {exc}"[:200])
            return
        self.history.complete(inv, "ok", digest=digest_of(data))


async def final_state(addresses: Mapping[str, str], datasets: Sequence[str]) -> list[ObjectState]:
    """Every region's newest version of every object (tombstones included)."""
    out: list[ObjectState] = []
    for region, address in addresses.items():
        async with AgentClient(address, timeout_s=OP_TIMEOUT_S) as client:
            for ds in datasets:
                try:
                    infos = await client.list(ds, include_deleted=True)
                except NotFoundError:
                    continue
                for info in infos:
                    v = info.version
                    digest = "" if v.digest is None else str(v.digest)
                    out.append(ObjectState(region, ds, info.key, str(v.hlc), digest, v.op))
    return out


async def settled_state(
    addresses: Mapping[str, str],
    datasets: Sequence[str],
    required: Mapping[str, Sequence[str]],
    timeout_s: float,
) -> list[ObjectState]:
    """`final_state` once every required region's fingerprint agrees (or at the bound):
    convergence is judged on what is there when the bound runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    state: list[ObjectState] = []
    for _ in range(int(timeout_s / 0.5) + 2):
        try:
            state = await final_state(addresses, datasets)
        except MeridianError as exc:
            log.info("chaos_final_state_retry", error=str(exc))
        else:
            prints: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
            for s in state:
                prints.setdefault((s.dataset, s.region), set()).add((s.key, s.version, s.digest))
            if all(
                len({frozenset(prints.get((ds, r), set())) for r in regions}) <= 1
                for ds, regions in required.items()
            ):
                return state
        if loop.time() >= deadline:
            break
        await asyncio.sleep(0.5)
    log.warning("chaos_wait_gave_up", waiting_for="convergence", seconds=timeout_s)
    return state


def of_run(version: str, since_ms: int) -> bool:
    """A version (HLC text `wall.logical@region`) made at or after `since_ms`: the
    private stack's Kafka keeps earlier runs' events, which are not this run's."""
    try:
        return int(version.split(".", 1)[0]) >= since_ms
    except ValueError:
        return False


async def published_events(
    bootstrap: str, since_ms: int, timeout_s: float = 20.0
) -> list[PublishedEvent]:
    """Every change event of this run (versions from `since_ms` on) in `meridian.changes`,
    read from the start to the end offsets."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=10_000
    )
    out: list[PublishedEvent] = []
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        await asyncio.wait_for(consumer.topics(), 5)
        # The client's metadata may not name the topic's partitions yet (None): the
        # project creates the topic with this count (controlplane/adapters/kafka.py).
        parts = consumer.partitions_for_topic(CHANGES_TOPIC.name) or set(
            range(CHANGES_TOPIC.partitions)
        )
        tps = [TopicPartition(CHANGES_TOPIC.name, p) for p in sorted(parts)]
        if not tps:
            return out
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _ in range(100_000):
            left = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
            if not left or loop.time() >= deadline:
                break
            batch = await consumer.getmany(*left, timeout_ms=500, max_records=1000)
            for tp, records in batch.items():
                for rec in records:
                    try:
                        e = decode_change_event(rec.value or b"")
                    except MessageError:
                        continue
                    if not of_run(str(e.version.hlc), since_ms):
                        continue
                    out.append(
                        PublishedEvent(
                            e.event_id,
                            e.dataset,
                            e.key,
                            str(e.version.hlc),
                            e.origin_region,
                            tp.partition,
                            rec.offset,
                        )
                    )
    finally:
        await consumer.stop()
    return out


def inventory(roots: Mapping[str, Path]) -> list[Copy]:
    return [c for region, root in roots.items() for c in inventory_root(root, region)]
