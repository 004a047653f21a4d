"""Three regions active-active, with real processes: an agent per region (`meridian agent
serve`, its outbox drained to the stack's Kafka) and a `meridian replicator run` per
region, on the harness's world (`corpus/*`: standard, copies in eu-west, eu-central
and us-east).

Every region writes the same few keys at once (puts, and deletes racing them), and
change events with exact ties are injected on purpose: two origins with the same wall
time and logical counter (the region name decides), and one version published twice
with other content (a collision: whatever is held first is kept, the same everywhere
since one key's events share a partition). After quiescence every region holds, for
every key, the newest version written (by HLC), and the fingerprints of (key, version,
digest) match. Then the consumer groups are reset to where this test's events begin
and the replicators restarted: the replay applies nothing (LWW: every event is the
same version or older), and nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import WORLD_REGIONS, AgentProcess, prepare_world
from harness.catalogs import scratch_postgres
from repl_world import ReplicatorProcess, group_committed, publish
from waiting import until

from agents.client import AgentClient
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaAdmin
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Version
from controlplane.errors import NotFoundError
from replicator.config import group_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REGIONS = [name for name, _ in WORLD_REGIONS]  # eu-west, eu-central, us-east
KEYS = [f"k{i}" for i in range(4)]
ROUNDS = 3
Fingerprint = dict[str, tuple[str, str, str]]  # key -> (hlc, op, digest)


@pytest.fixture
def world(
    tmp_path: Path, etcd_endpoint: str, postgres_url: str, kafka_bootstrap: str
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    with scratch_postgres(postgres_url, prefix="meridian_repl3") as url:
        yield prepare_world(tmp_path / "world", etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
async def agents(tmp_path: Path, world: dict[str, str]) -> AsyncIterator[dict[str, AgentProcess]]:
    procs = {r: AgentProcess(r, tmp_path / r, world, tmp_path / f"{r}.log") for r in REGIONS}
    try:
        await asyncio.gather(*(asyncio.to_thread(p.start, 90) for p in procs.values()))
        yield procs
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs.values()))


def replicators(
    agents: dict[str, AgentProcess], world: dict[str, str], folder: Path, run: str
) -> dict[str, ReplicatorProcess]:
    return {
        r: ReplicatorProcess(r, a.address, world, folder / r, replicator_id=run)
        for r, a in agents.items()
    }


async def log_ends(kafka: str) -> dict[TopicPartition, int]:
    async with KafkaAdmin(kafka) as admin:
        await admin.ensure_topics([CHANGES_TOPIC])
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(CHANGES_TOPIC.name, p) for p in range(CHANGES_TOPIC.partitions)]
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return ends
    finally:
        await consumer.stop()


async def reset_group(kafka: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit `offsets` for `group` (its members stopped): its next member starts there."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(dict(offsets))
    finally:
        await consumer.stop()


async def caught_up(kafka: str, ends: dict[TopicPartition, int], timeout_s: float) -> None:
    """Until every region's group has committed up to `ends` (bounded in time)."""
    behind: dict[str, int] = {}

    async def none_behind() -> bool:
        behind.clear()
        for region in REGIONS:
            got = await group_committed(kafka, group_id(region))
            lag = sum(max(0, end - got.get(tp, -1)) for tp, end in ends.items() if end > 0)
            if lag:
                behind[region] = lag
        return not behind

    what = "every region's replicators to commit past the ends"
    await until(none_behind, timeout_s, what, step_s=0.5, detail=lambda: behind)


async def events_of(
    kafka: str, dataset: str, starts: dict[TopicPartition, int], ends: dict[TopicPartition, int]
) -> int:
    """How many change events of `dataset` the log holds between `starts` and `ends`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False)
    await consumer.start()
    count = 0
    try:
        wanted = {tp: end for tp, end in ends.items() if end > starts.get(tp, 0)}
        consumer.assign(list(wanted))
        for tp in wanted:
            consumer.seek(tp, starts.get(tp, 0))
        prefix = f"{dataset}/".encode()
        for _ in range(10_000):  # bounded: each round reads what is there
            positions = {tp: await consumer.position(tp) for tp in wanted}
            if all(positions[tp] >= end for tp, end in wanted.items()):
                break
            batches = await consumer.getmany(timeout_ms=500)
            for tp, msgs in batches.items():
                count += sum(
                    1 for m in msgs if m.offset < wanted[tp] and (m.key or b"").startswith(prefix)
                )
        return count
    finally:
        await consumer.stop()


async def fingerprint(client: AgentClient, dataset: str) -> Fingerprint:
    return {
        o.key: (o.version.hlc.text, o.version.op, str(o.version.digest))
        for o in await client.list(dataset, include_deleted=True)
    }


async def converged(
    clients: dict[str, AgentClient], dataset: str, want: Fingerprint, timeout_s: float
) -> None:
    got: dict[str, Fingerprint] = {}

    async def same() -> bool:
        got.update({r: await fingerprint(c, dataset) for r, c in clients.items()})
        return all(g == want for g in got.values())

    await until(same, timeout_s, f"every region to hold {want}", step_s=0.5, detail=lambda: got)


def injected(dataset: str, wall_ms: int) -> list[ChangeEvent]:
    """Exact ties on purpose, from origins that run no agent (so every region applies
    them): `tie` at one (wall, logical) from two origins; `twin` at one HLC twice with
    different bytes."""

    def put(key: str, origin: str, data: bytes) -> ChangeEvent:
        version = Version.put(HLC(wall_ms, 7, origin), len(data), Digest.of(data))
        return ChangeEvent(
            event_id=uuid.uuid4().hex,
            dataset=dataset,
            key=key,
            version=version,
            origin_region=origin,
            policy_revision=1,
            inline=data,
        )

    return [
        put("tie", "ap-east", b"from ap-east"),
        put("tie", "ap-south", b"from ap-south"),  # same wall and logical: region decides
        put("twin", "ap-south", b"first twin"),
        put("twin", "ap-south", b"second twin, same HLC"),  # a collision: the first stays
    ]


async def write_everywhere(
    clients: dict[str, AgentClient], dataset: str
) -> list[tuple[str, Version]]:
    """Each region puts every key ROUNDS times, and deletes some, all at once."""
    written: list[tuple[str, Version]] = []

    async def region_writes(region: str, client: AgentClient) -> None:
        for n in range(ROUNDS):
            for key in KEYS:

                async def body(
                    data: bytes = f"{region}/{key}/{n}".encode(),
                ) -> AsyncIterator[bytes]:
                    yield data

                written.append((key, await client.put(dataset, key, body())))
                if (n + KEYS.index(key) + REGIONS.index(region)) % 4 == 0:
                    # NotFoundError: raced by another region's delete applied here.
                    with contextlib.suppress(NotFoundError):
                        written.append((key, await client.delete(dataset, key)))

    await asyncio.gather(*(region_writes(r, c) for r, c in clients.items()))
    return written


async def test_three_regions_converge_on_lww_with_ties_and_a_replay_changes_nothing(
    tmp_path: Path, world: dict[str, str], agents: dict[str, AgentProcess], kafka_bootstrap: str
) -> None:
    dataset = f"corpus/lww-{uuid.uuid4().hex[:8]}"
    starts = await log_ends(kafka_bootstrap)
    repls = replicators(agents, world, tmp_path / "repl", "first")
    for r in repls.values():
        r.start()
    clients = {r: AgentClient(a.address) for r, a in agents.items()}
    try:
        await asyncio.gather(*(r.wait_log("replicator_started", 90) for r in repls.values()))
        # Stamped now: not ahead of any region's clock (that is quarantined as skew).
        ties = injected(dataset, system_ms())
        await publish(kafka_bootstrap, ties[:2] + ties[2:3])
        written = await write_everywhere(clients, dataset)
        await publish(kafka_bootstrap, ties[3:])
        # What every region must show: per key, the newest version written anywhere.
        want: Fingerprint = {}
        for key, version in [*((e.key, e.version) for e in ties[:3]), *written]:
            held = want.get(key)
            if held is None or HLC.parse(held[0]) < version.hlc:
                want[key] = (version.hlc.text, version.op, str(version.digest))
        assert want["tie"][0].endswith("@ap-south")
        await converged(clients, dataset, want, timeout_s=120)
        ends = await log_ends(kafka_bootstrap)
        await caught_up(kafka_bootstrap, ends, timeout_s=60)
        on_log = await events_of(kafka_bootstrap, dataset, starts, ends)
        assert len(ties) <= on_log <= len(written) + len(ties)
        before = {r: await fingerprint(c, dataset) for r, c in clients.items()}
        for r in repls.values():
            assert r.terminate() == 0, r.log()[-2000:]

        # Replay this test's part of the log: every group back to where it began.
        for region in REGIONS:
            await reset_group(kafka_bootstrap, group_id(region), starts)
        again = replicators(agents, world, tmp_path / "repl", "replay")
        for r in again.values():
            r.start()
        repls = again
        await caught_up(kafka_bootstrap, ends, timeout_s=120)
        after = {r: await fingerprint(c, dataset) for r, c in clients.items()}
        assert after == before
        for region, r in again.items():
            outcomes = [
                line["outcome"]
                for line in _events(r.log())
                if line.get("event") == "event_applied" and line.get("dataset") == dataset
            ]
            # Every event of this dataset on the log came again (the other regions'
            # writes and the injected ones; its own are skipped as `own`), and none
            # applied a thing. (Fewer events than writes: a put pruned at its origin
            # before its event went out is not sent, its key's newer one is.)
            assert len(outcomes) >= on_log, (region, len(outcomes), on_log)
            assert "applied" not in outcomes, (region, outcomes.count("applied"))
    finally:
        for c in clients.values():
            await c.close()
        for r in repls.values():
            r.kill()


def _events(text: str) -> Iterator[dict[str, object]]:
    for raw in text.splitlines():
        try:
            found = json.loads(raw)
        except ValueError:
            continue
        if isinstance(found, dict):
            yield found
