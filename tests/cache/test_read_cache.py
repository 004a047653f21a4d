"""The read-through cache (issue 16) with real agent processes, etcd and Kafka.

eu-west holds `cached/*` (home); eu-north (two agents, a cache of 3 MiB each) holds no
replica and reads through its cache; us-east (US, a cache too) is outside the
dataset's residency. Each test names its own dataset (a dataset's cached reads go to
one agent of the region), so they do not disturb each other's entries.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from cache_world import get, metric, prepare_cache_world, put, until
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess
from harness.cli_schema import check_output
from harness.controllers import run_cli

from agents.routing.peers import ROUTED_KEY
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

LIMIT = 3 << 20


class World:
    def __init__(self, env: dict[str, str], agents: dict[str, list[AgentProcess]]) -> None:
        self.env = env
        self.agents = agents

    @property
    def home(self) -> AgentProcess:
        return self.agents["eu-west"][0]

    @property
    def north(self) -> list[AgentProcess]:
        return self.agents["eu-north"]

    @property
    def south(self) -> AgentProcess:
        return self.agents["eu-south"][0]

    @property
    def us(self) -> AgentProcess:
        return self.agents["us-east"][0]


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, kafka_bootstrap: str
) -> Iterator[World]:
    clear_keyspace(etcd_endpoint)
    folder = tmp_path_factory.mktemp("cache-world")
    env = prepare_cache_world(
        folder,
        etcd_endpoint,
        kafka_bootstrap,
        f"eu-north={LIMIT},eu-south={LIMIT},us-east={LIMIT}",
    )
    env["MERIDIAN_CACHE_PREFETCH"] = "8"
    agents: dict[str, list[AgentProcess]] = {}
    try:
        for region, count in (("eu-west", 1), ("eu-north", 2), ("eu-south", 1), ("us-east", 1)):
            for n in range(count):
                proc = AgentProcess(
                    region,
                    folder / f"{region}-{n}",
                    # eu-south reads no change log (nothing listens there).
                    {**env, "MERIDIAN_KAFKA": "127.0.0.1:1"} if region == "eu-south" else env,
                    folder / f"{region}-{n}.log",
                    metrics=True,
                    lease_ttl_s=3,
                )
                agents.setdefault(region, []).append(proc.spawn())
        for procs in agents.values():  # spawned together, waited for together
            for proc in procs:
                event = proc.wait_event("agent_ready", 90)
                if event is None:
                    raise RuntimeError(f"agent did not start: {proc.log_tail()}")
                proc.address = str(event["endpoint"])
                proc.metrics_address = str(event.get("metrics") or "")
        for proc in agents["eu-north"]:
            # Entries are trusted (served without a question to a holder) only once
            # the change log is read: the invalidation test needs that.
            if proc.wait_event("cache_changelog_current", 90) is None:
                raise RuntimeError(f"the cache never read the change log: {proc.log_tail()}")
        yield World(env, agents)
    finally:
        for procs in agents.values():
            for proc in procs:
                if proc.running:
                    proc.kill()
        clear_keyspace(etcd_endpoint)


def scrape(proc: AgentProcess) -> str:
    with urllib.request.urlopen(f"http://{proc.metrics_address}/metrics", timeout=10) as r:
        return str(r.read().decode())


async def total(procs: list[AgentProcess], name: str, labels: str = "") -> float:
    texts = await asyncio.gather(*(asyncio.to_thread(scrape, p) for p in procs))
    return sum(metric(t, name, labels) for t in texts)


async def own_objects(address: str, dataset: str) -> list[str]:
    """What the agent's own store lists (a List marked routed is served locally)."""
    async with grpc.aio.insecure_channel(address) as channel:
        page = await agent_pb2_grpc.AgentStub(channel).List(
            agent_pb2.ListRequest(dataset=dataset, page_size=1000),
            metadata=((ROUTED_KEY, "test"),),
            timeout=30,
        )
    return [info.key for info in page.objects]


async def test_read_is_served_cached_and_counts_as_no_replica(world: World) -> None:
    data = os.urandom(1 << 20)
    version = await put(world.home.address, "cached/serve", "shard-0", data)
    hits = await total(world.north, "meridian_cache_reads_total", 'result="hit"')
    for proc in world.north:  # either agent: the read goes to the dataset's agent
        assert await get(proc.address, "cached/serve", "shard-0") == (version, data)
    assert await total(world.north, "meridian_cache_reads_total", 'result="hit"') == hits + 1
    for proc in world.north:  # no replica: the agents' own stores do not hold it
        assert await own_objects(proc.address, "cached/serve") == []

    def shown() -> dict[str, object] | None:
        done = run_cli(["region", "show", "eu-north", "--output", "json"], world.env)
        assert done.returncode == 0, done.stderr
        doc: dict[str, object] = json.loads(done.stdout)
        cache = doc["cache"]
        # The report is rewritten every few seconds: one written between the first
        # read's fill and the second read's hit shows the bytes without the hit.
        ready = isinstance(cache, dict) and cache["bytes"] >= len(data) and cache["hit_rate"] > 0
        return doc if ready else None

    await until(shown, 60, "region show to report the cached bytes", poll_s=0.5)
    doc = shown()
    assert doc is not None
    check_output("region_show", doc)
    cache = doc["cache"]
    assert isinstance(cache, dict)
    assert cache["limit_bytes"] == 2 * LIMIT
    assert 0 < cache["hit_rate"] <= 1
    table = run_cli(["region", "show", "eu-north", "--output", "table"], world.env)
    assert table.returncode == 0 and f"of {2 * LIMIT} bytes, hit rate" in table.stdout

    def audited() -> bool:  # the fill, shipped by the recorder: a transfer into eu-north
        done = run_cli(
            ["audit", "transfers", "--dataset", "cached/serve", "--output", "json"], world.env
        )
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        return any(
            r["object"] == "shard-0" and r["to"] == "eu-north" and r["outcome"] == "completed"
            for r in rows
        )

    await until(audited, 120, "audit transfers to list the cache fill", poll_s=0.5)

    def located() -> set[str]:
        done = run_cli(["audit", "dataset", "cached/serve", "--output", "json"], world.env)
        return {r["region"] for r in json.loads(done.stdout)} if done.returncode == 0 else set()

    # The catalog knows the copy at eu-west (its recorder ships on its own), and no
    # replica in eu-north, whose fill record is shipped already (a cached copy is none).
    await until(lambda: "eu-west" in located(), 120, "the catalog to know eu-west's copy")
    assert "eu-north" not in located()


async def test_read_outside_residency_is_refused(world: World) -> None:
    data = os.urandom(64 << 10)
    await put(world.home.address, "cached/us", "shard-0", data)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await get(world.us.address, "cached/us", "shard-0")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "cached copy" in str(refused.value.details())
    text = await asyncio.to_thread(scrape, world.us)
    assert (
        metric(text, "meridian_residency_refused_total", 'dataset="cached/us",direction="receive"')
        >= 1
    )
    assert metric(text, "meridian_cache_bytes") == 0
    assert metric(text, "meridian_transfers_total", 'direction="in",outcome="refused"') >= 1

    def audited() -> bool:  # the refusal is journalled and shipped like every refused copy
        done = run_cli(
            ["audit", "transfers", "--dataset", "cached/us", "--output", "json"], world.env
        )
        assert done.returncode == 0, done.stderr
        return any(
            r["to"] == "us-east" and r["outcome"] == "refused" for r in json.loads(done.stdout)
        )

    await until(audited, 120, "audit transfers to list the refused cache fill", poll_s=0.5)


async def test_newer_write_elsewhere_invalidates_the_entry(world: World) -> None:
    first, second = os.urandom(300 << 10), os.urandom(300 << 10)
    await put(world.home.address, "cached/inval", "shard-0", first)
    reader = world.north[0].address
    assert (await get(reader, "cached/inval", "shard-0"))[1] == first
    hits = await total(world.north, "meridian_cache_reads_total", 'result="hit"')
    assert (await get(reader, "cached/inval", "shard-0"))[1] == first
    assert await total(world.north, "meridian_cache_reads_total", 'result="hit"') == hits + 1
    dropped = await total(world.north, "meridian_cache_dropped_total", 'why="invalidated"')
    newer = await put(world.home.address, "cached/inval", "shard-0", second)

    async def fresh() -> bool:
        return await get(reader, "cached/inval", "shard-0") == (newer, second)

    await until(fresh, 60, "the cached read to return the newer version", poll_s=0.2)
    # Dropped by the change log's event (a trusted entry is served without asking).
    assert (
        await total(world.north, "meridian_cache_dropped_total", 'why="invalidated"') >= dropped + 1
    )


async def test_without_the_change_log_every_hit_is_checked_at_a_holder(world: World) -> None:
    first, second = os.urandom(200 << 10), os.urandom(200 << 10)
    await put(world.home.address, "cached/unlogged", "shard-0", first)
    reader = world.south.address
    assert (await get(reader, "cached/unlogged", "shard-0"))[1] == first
    hits = await total([world.south], "meridian_cache_reads_total", 'result="hit"')
    assert (await get(reader, "cached/unlogged", "shard-0"))[1] == first  # checked, still hit
    assert await total([world.south], "meridian_cache_reads_total", 'result="hit"') == hits + 1
    newer = await put(world.home.address, "cached/unlogged", "shard-0", second)
    # No change log: the very next read asks the holder, sees the newer version, refills.
    assert await get(reader, "cached/unlogged", "shard-0") == (newer, second)
    why = 'why="a newer version at the holders"'
    assert await total([world.south], "meridian_cache_dropped_total", why) >= 1


async def test_eviction_keeps_the_cache_within_its_bound(world: World) -> None:
    blobs = {f"e{n}": os.urandom(1 << 20) for n in range(6)}
    for key, data in blobs.items():
        await put(world.home.address, "cached/evict", key, data)
    evicted = await total(world.north, "meridian_cache_dropped_total", 'why="evicted"')
    reader = world.north[1].address
    for key in sorted(blobs, reverse=True):  # descending: no walk, no prefetch
        assert (await get(reader, "cached/evict", key))[1] == blobs[key]
        for proc in world.north:
            assert metric(await asyncio.to_thread(scrape, proc), "meridian_cache_bytes") <= LIMIT
    assert await total(world.north, "meridian_cache_dropped_total", 'why="evicted"') >= evicted + 3
    misses = await total(world.north, "meridian_cache_reads_total", 'result="miss"')
    assert (await get(reader, "cached/evict", "e5"))[1] == blobs["e5"]  # evicted first
    assert await total(world.north, "meridian_cache_reads_total", 'result="miss"') == misses + 1


async def test_a_sequential_reader_is_prefetched_ahead(world: World) -> None:
    blobs = {f"w{n:02d}": os.urandom(128 << 10) for n in range(10)}
    for key, data in blobs.items():
        await put(world.home.address, "cached/walk", key, data)
    reader = world.north[0].address
    keys = sorted(blobs)
    for key in keys[:2]:  # a walk: the second read follows a smaller key
        assert (await get(reader, "cached/walk", key))[1] == blobs[key]

    def prefetched() -> int:
        return sum(
            1
            for proc in world.north
            for e in proc.events()
            if e.get("event") == "prefetched" and e.get("dataset") == "cached/walk"
        )

    await until(lambda: prefetched() >= 8, 60, "the next 8 shards to be prefetched")
    hits = await total(world.north, "meridian_cache_reads_total", 'result="hit"')
    for key in keys[2:]:
        assert (await get(reader, "cached/walk", key))[1] == blobs[key]
    assert await total(world.north, "meridian_cache_reads_total", 'result="hit"') == hits + 8
