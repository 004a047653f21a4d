"""The agent's periodic tombstone expiry (agents/daemon/expiry.py) over a real store:
a pass forgets what outlived the retention and counts it, only what its dataset
predicate and `confirm` allow; a failed pass, or a failed or slow `confirm`, is
survived and keeps the tombstones."""

from __future__ import annotations

import asyncio

from store_helpers import StoreFactory

from agents.daemon.expiry import TombstoneExpiry
from agents.metrics import AgentMetrics
from agents.store import ObjectStore
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Version


async def every_key(_dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
    return {key for key, _ in deletes}


def expired_deletes(store: ObjectStore, dataset: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        put = Version.put(HLC(system_ms() - 180_000, 0, "us-east"), 1, Digest.of(b"x"))
        store.apply(dataset, key, put, [b"x"])
        store.apply(dataset, key, Version.delete(HLC(system_ms() - 120_000, 0, "us-east")), None)


async def test_each_pass_forgets_the_tombstones_past_the_retention(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    put = Version.put(HLC(system_ms() - 180_000, 0, "us-east"), 7, Digest.of(b"rotated"))
    store.apply("logs", "old", put, [b"rotated"])
    store.apply("logs", "old", Version.delete(HLC(system_ms() - 120_000, 0, "us-east")), None)
    store.put("logs", "recent", [b"rotated"])
    store.delete("logs", "recent")  # younger than the retention: kept
    store.apply("ckpt", "old", put, [b"rotated"])  # a dataset it must not expire
    store.apply("ckpt", "old", Version.delete(HLC(system_ms() - 120_000, 0, "us-east")), None)
    metrics = AgentMetrics("eu-west")
    expiry = TombstoneExpiry(
        store, metrics, lambda dataset: dataset == "logs", every_key, interval_s=0.01
    )
    async with expiry:
        await asyncio.wait_for(expiry.wait_passes(1), timeout=10)
    assert store.versions("logs", "old") == []
    assert len(store.versions("ckpt", "old")) == 2
    assert store.versions("logs", "recent")[0].version.is_tombstone
    assert metrics.tombstones_expired._value.get() == 1


async def test_a_failed_pass_is_logged_and_the_next_one_runs(open_store: StoreFactory) -> None:
    store = open_store()
    store.close()  # every pass fails: the store is closed
    expiry = TombstoneExpiry(
        store, AgentMetrics("eu-west"), lambda _: True, every_key, interval_s=0.01
    )
    async with expiry:
        await asyncio.wait_for(expiry.wait_passes(2), timeout=10)
        assert expiry.running


async def test_a_dataset_whose_class_cannot_be_told_keeps_its_tombstones(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    asked: list[str] = []

    def expirable(dataset: str) -> bool:
        asked.append(dataset)
        if dataset == "odd":
            raise ValueError("its rule cannot be planned")
        return True

    for dataset in ("odd", "logs"):
        for key in ("a", "b"):
            put = Version.put(HLC(system_ms() - 180_000, 0, "us-east"), 1, Digest.of(b"x"))
            store.apply(dataset, key, put, [b"x"])
            gone = Version.delete(HLC(system_ms() - 120_000, 0, "us-east"))
            store.apply(dataset, key, gone, None)
    expiry = TombstoneExpiry(store, AgentMetrics("eu-west"), expirable, every_key, interval_s=3600)
    assert await expiry.expire_once() == 2
    assert sorted(asked) == ["logs", "odd"]  # once per dataset, not per object
    assert [len(store.versions("odd", k)) for k in ("a", "b")] == [2, 2]


async def test_only_the_keys_confirm_allows_go_and_a_failing_confirm_keeps_its_batch(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    expired_deletes(store, "ckpt", ("a", "b", "c"))
    expired_deletes(store, "odd", ("a",))
    asked: list[tuple[str, list[str]]] = []

    async def confirm(dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        asked.append((dataset, [key for key, _ in deletes]))
        if dataset == "odd":
            raise ConnectionError("a copy region cannot be asked")
        # the store's lock is not held: confirm may read it (as a proof reads agents)
        assert store.versions(dataset, "a")
        return {"a", "c"}

    expiry = TombstoneExpiry(store, AgentMetrics("eu-west"), lambda _: True, confirm)
    assert await expiry.expire_once() == 2
    assert asked == [("ckpt", ["a", "b", "c"]), ("odd", ["a"])]
    assert [len(store.versions("ckpt", k)) for k in ("a", "b", "c")] == [0, 2, 0]
    assert len(store.versions("odd", "a")) == 2


async def test_a_confirm_without_an_answer_in_time_keeps_the_tombstones(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    expired_deletes(store, "ckpt", ("a",))
    release = asyncio.Event()

    async def confirm(_dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        await release.wait()
        return {key for key, _ in deletes}

    expiry = TombstoneExpiry(
        store, AgentMetrics("eu-west"), lambda _: True, confirm, confirm_timeout_s=0.2
    )
    assert await expiry.expire_once() == 0
    assert len(store.versions("ckpt", "a")) == 2
    release.set()


async def test_a_pass_running_at_stop_expires_nothing_more_and_stop_waits_for_it(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    expired_deletes(store, "ckpt", ("a",))
    asked, release = asyncio.Event(), asyncio.Event()
    cancelled: list[bool] = []

    async def confirm(_dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        asked.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return {key for key, _ in deletes}

    expiry = TombstoneExpiry(
        store, AgentMetrics("eu-west"), lambda _: True, confirm, interval_s=0.01
    )
    await expiry.start()
    await asyncio.wait_for(asyncio.shield(asked.wait()), timeout=10)
    await asyncio.wait_for(expiry.stop(), timeout=10)
    release.set()  # an answer now would come too late
    assert cancelled == [True]
    assert expiry._work is not None and expiry._work.done()  # the thread left the store
    assert len(store.versions("ckpt", "a")) == 2


async def test_an_answer_that_comes_once_the_agent_stops_is_not_applied(
    open_store: StoreFactory,
) -> None:
    store = open_store(tombstone_retention_s=60)
    expired_deletes(store, "ckpt", ("a",))
    expiry: TombstoneExpiry | None = None

    async def confirm(_dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        assert expiry is not None
        expiry._closing.set()  # the agent began to stop while the proof was made
        return {key for key, _ in deletes}

    expiry = TombstoneExpiry(store, AgentMetrics("eu-west"), lambda _: True, confirm)
    assert await expiry.expire_once() == 0
    assert len(store.versions("ckpt", "a")) == 2


def test_a_pass_told_to_stop_touches_no_further_batch(open_store: StoreFactory) -> None:
    store = open_store(tombstone_retention_s=60)
    expired_deletes(store, "ckpt", ("a", "b", "c"))
    asked: list[list[str]] = []

    def confirm(_dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        asked.append([key for key, _ in deletes])
        return {key for key, _ in deletes}

    # One object a batch; the agent stops once the first was asked about.
    assert store.expire_tombstones(batch=1, confirm=confirm, stopping=lambda: bool(asked)) == 1
    assert asked == [["a"]]
    assert [len(store.versions("ckpt", k)) for k in "abc"] == [0, 2, 2]
