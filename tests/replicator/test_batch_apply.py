"""`ReplicateMany` against a real agent process (`meridian agent serve` of us-east in the
harness's world: `corpus/*` may be held anywhere, `eu/*` only in the EU): one call
applies many inline puts and deletes by LWW, each item answered on its own: a refused
item (residency) does not fail the others, a
replay of the same items is a no-op, an older version loses to the newer one held."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess, prepare_world
from harness.catalogs import scratch_postgres

from agents.client import AgentClient, ReplicateItem, ReplicateOutcome
from agents.errors import ResidencyError
from agents.store.errors import DigestMismatchError
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Verdict, Version
from controlplane.errors import NotFoundError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    etcd_endpoint: str,
    postgres_url: str,
    kafka_bootstrap: str,
) -> Iterator[dict[str, str]]:
    clear_keyspace(etcd_endpoint)
    with scratch_postgres(postgres_url, prefix="meridian_repl_batch") as url:
        yield prepare_world(tmp_path_factory.mktemp("world"), etcd_endpoint, url, kafka_bootstrap)


@pytest.fixture
async def us_east(tmp_path: Path, world: dict[str, str]) -> AsyncIterator[AgentProcess]:
    proc = AgentProcess("us-east", tmp_path / "us-east", world, tmp_path / "us-east.log")
    await asyncio.to_thread(proc.start, 60)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


def put_item(dataset: str, key: str, data: bytes, wall_ms: int) -> ReplicateItem:
    version = Version.put(HLC(wall_ms, 0, "eu-west"), len(data), Digest.of(data))
    return ReplicateItem(dataset, key, version, data, "eu-west", 1)


async def test_one_call_applies_each_item_on_its_own(us_east: AgentProcess) -> None:
    t = system_ms() - 5_000
    run = uuid.uuid4().hex[:8]
    ds = f"corpus/batch-{run}"
    contents = {f"k{i}": os.urandom(1024) for i in range(40)}
    items = [put_item(ds, k, d, t) for k, d in contents.items()]
    items.append(put_item(f"eu/batch-{run}", "private", b"EU only", t))  # not in us-east
    async with AgentClient(us_east.address) as agent:
        answers = await agent.replicate_many(items)
        assert len(answers) == len(items)
        for item, answer in zip(items[:40], answers[:40], strict=True):
            assert answer == ReplicateOutcome(Verdict.APPLY, item.version)
        assert isinstance(answers[40], ResidencyError)
        assert "may only be held in EU" in str(answers[40])
        for k, data in list(contents.items())[:3]:
            _version, got = await agent.get_bytes(ds, k)
            assert got == data
        with pytest.raises(NotFoundError):
            await agent.stat(f"eu/batch-{run}", "private")

        # Replayed: the same versions again are no-ops; an older one loses; a delete
        # (a tombstone, newer) applies beside them.
        older = put_item(ds, "k1", b"stale", t - 1_000)
        gone = Version.delete(HLC(t + 1, 0, "eu-west"))
        again = await agent.replicate_many(
            [items[0], older, ReplicateItem(ds, "k2", gone, None, "eu-west", 1)]
        )
        assert again == [
            ReplicateOutcome(Verdict.SAME, items[0].version),
            ReplicateOutcome(Verdict.OLDER, items[1].version),
            ReplicateOutcome(Verdict.APPLY, gone),
        ]
        with pytest.raises(NotFoundError):
            await agent.stat(ds, "k2")
        assert (await agent.stat(ds, "k1")).version == items[1].version


async def test_a_malformed_item_fails_the_call_and_stores_nothing(us_east: AgentProcess) -> None:
    t = system_ms() - 5_000
    ds = f"corpus/batch-{uuid.uuid4().hex[:8]}"
    good = put_item(ds, "good", b"fine", t)
    lying = put_item(ds, "lying", b"the digest says this", t)
    wrong = b"but the bytes differ"
    assert len(wrong) == lying.version.size
    bad = ReplicateItem(ds, "lying", lying.version, wrong, "eu-west", 1)
    async with AgentClient(us_east.address) as agent:
        with pytest.raises(DigestMismatchError):
            await agent.replicate_many([good, bad])
        for key in ("good", "lying"):
            with pytest.raises(NotFoundError):
                await agent.stat(ds, key)
