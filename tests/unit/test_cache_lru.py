"""The read cache's bookkeeping (agents/cache/lru.py) and its setting
(`MERIDIAN_REGION_CACHE`): the bound holds, the oldest goes first, a hit renews."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import cast

import pytest
from waiting import until

from agents.cache.cache import ReadCache
from agents.cache.lru import Entry, LruIndex
from controlplane.domain.hlc import HLC
from controlplane.domain.placement import Placement
from controlplane.domain.version import Digest, Version
from controlplane.errors import ConfigError
from controlplane.settings import Settings

DIGEST = Digest.parse("blake3:" + "0" * 64)


def entry(key: str, size: int, wall_ms: int = 1) -> Entry:
    return Entry("d", key, Version(HLC(wall_ms, 0, "eu-west"), "put", size, DIGEST))


def test_admitting_past_the_bound_evicts_the_oldest_first() -> None:
    index = LruIndex(100)
    assert index.admit(entry("a", 40)) == []
    assert index.admit(entry("b", 40)) == []
    evicted = index.admit(entry("c", 40))
    assert [e.key for e in evicted] == ["a"]
    assert index.bytes == 80 and index.names() == [("d", "b"), ("d", "c")]


def test_a_hit_makes_an_entry_the_youngest() -> None:
    index = LruIndex(100)
    for key in ("a", "b"):
        index.admit(entry(key, 40))
    assert index.get(("d", "a")) is not None
    assert [e.key for e in index.admit(entry("c", 40))] == ["b"]


def test_a_replaced_entry_counts_once_and_one_larger_than_the_bound_is_not_kept() -> None:
    index = LruIndex(100)
    index.admit(entry("a", 40))
    index.admit(entry("a", 60, wall_ms=2))
    assert index.bytes == 60 and len(index) == 1
    evicted = index.admit(entry("huge", 101))
    assert {e.key for e in evicted} == {"a", "huge"} and index.bytes == 0


def test_region_cache_setting_is_parsed_or_refused_with_its_name() -> None:
    settings = Settings(region_cache="eu-north=64MiB, us-west=1000")
    assert settings.cache_limit_of("eu-north") == 64 << 20
    assert settings.cache_limit_of("us-west") == 1000
    assert settings.cache_limit_of("eu-west") is None
    for bad in ("eu-north=0", "eu-north=64MB", "=5", "eu-north"):
        with pytest.raises(ConfigError, match="MERIDIAN_REGION_CACHE"):
            _ = Settings(region_cache=bad).region_cache_map


def test_only_an_entry_filled_as_the_newest_is_trusted_as_the_newest() -> None:
    # An entry filled by a read of one version (by its HLC) may be older than what the
    # holders have, which the change log need not have announced (written before this
    # agent read it): a read of the newest asks the holders about it.
    cache = object.__new__(ReadCache)
    cache.fresh_s, cache._log_read_at = 10.0, time.monotonic()
    placement = cast(Placement, SimpleNamespace(dataset_class="standard"))
    newest = entry("k", 10)
    by_hlc = Entry(newest.dataset, newest.key, newest.version, newest=False)
    assert newest == by_hlc  # the same entry of the index
    assert cache._trusted_entry(placement, newest)
    assert not cache._trusted_entry(placement, by_hlc)


async def test_a_fill_tries_the_other_agents_of_the_holder_region(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Stat that named the version was routed across the holder region, but a
    # transfer is served only by an agent that holds the object: the others are tried.
    import agents.cache.cache as cache_module
    from agents.transfer.pull import Source
    from controlplane.errors import NotFoundError

    asked: list[str] = []

    async def pull(*args: object, **kwargs: object) -> None:
        source = args[2]
        assert isinstance(source, Source)
        asked.append(source.address)
        if source.address != "10.0.0.3:7400":
            raise NotFoundError(f"not held at {source.address}")

    class Peers:
        async def addresses(self, region: str) -> list[str]:
            return ["10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"]

    monkeypatch.setattr(cache_module, "pull", pull)
    cache = object.__new__(ReadCache)
    cache.peers = Peers()  # type: ignore[assignment]
    cache.region, cache.metrics, cache.policy = "eu-north", None, None  # type: ignore[assignment]
    version = entry("k", 10).version
    source = Source("eu-west", "10.0.0.1:7400")
    await cache._pull(None, None, source, "d", "k", version)  # type: ignore[arg-type]
    assert asked == ["10.0.0.1:7400", "10.0.0.2:7400", "10.0.0.3:7400"]
    asked.clear()

    async def nowhere(*args: object, **kwargs: object) -> None:
        raise NotFoundError("not held here")

    monkeypatch.setattr(cache_module, "pull", nowhere)
    with pytest.raises(NotFoundError):  # held by none: said once every agent was asked
        await cache._pull(None, None, source, "d", "k", version)  # type: ignore[arg-type]


async def test_a_prefetch_whose_bytes_went_stale_meanwhile_leaves_none_behind() -> None:
    # The change log announced a newer version while the prefetch pulled the listed
    # one: the fill keeps no entry, and the bytes it stored go too (no index entry
    # counted them against the bound).
    from agents.transfer.pull import Source

    handed_off: list[tuple[str, str, HLC]] = []
    old, new = entry("k", 10, wall_ms=1).version, entry("k", 10, wall_ms=2).version

    class Store:
        def hand_off(self, dataset: str, key: str, newest: HLC) -> bool:
            handed_off.append((dataset, key, newest))
            return True

    cache = object.__new__(ReadCache)
    cache.index, cache._filling, cache._seen = LruIndex(1000), {}, {}
    cache.store, cache.book = Store(), object()  # type: ignore[assignment]

    async def pull(*args: object) -> None:
        cache._seen[("d", "k")] = new.hlc  # announced while the bytes came

    async def nothing() -> None:
        return None

    cache._pull = pull  # type: ignore[method-assign]
    cache._ship_records = nothing  # type: ignore[method-assign]
    placement = cast(Placement, None)
    known = (Source("eu-west", "10.0.0.1:7400"), old)
    assert await cache.fill(placement, "d", "k", None, known=known) is None
    assert handed_off == [("d", "k", old.hlc)]
    assert ("d", "k") not in cache.index


async def test_a_narrowed_residency_drops_the_cached_copies_at_once() -> None:
    # At each new revision the sweeper drops the entries of datasets this region may no
    # longer hold (and of datasets no policy governs), not only at their next read.
    from agents.cache.residency import ResidencySweeper
    from agents.errors import NotGovernedError

    handed_off: list[tuple[str, str]] = []

    class Store:
        def hand_off(self, dataset: str, key: str, newest: HLC) -> bool:
            handed_off.append((dataset, key))
            return True

    class Policy:
        def __init__(self, revision: int, residency: dict[str, tuple[str, ...]]) -> None:
            self.revision, self.residency = revision, residency

        def jurisdiction(self, region: str) -> str:
            return "US"

    class View:
        def __init__(self, current: Policy) -> None:
            self.current = current
            self.changed = asyncio.Condition()

        async def wait_for(self, predicate: object, timeout_s: float) -> object:
            async with asyncio.timeout(timeout_s), self.changed:
                await self.changed.wait_for(lambda: predicate(self.current))  # type: ignore[operator]
            return self.current

        async def publish(self, policy: Policy) -> None:
            async with self.changed:
                self.current = policy
                self.changed.notify_all()

    view = View(Policy(1, {"kept": ("EU", "US"), "narrowed": ("EU", "US"), "gone": ("US",)}))

    class Admission:
        def placement(self, dataset: str) -> SimpleNamespace:
            found = view.current.residency.get(dataset)
            if found is None:
                raise NotGovernedError(f"no policy governs {dataset}")
            return SimpleNamespace(residency=found)

    cache = object.__new__(ReadCache)
    cache.index, cache.region = LruIndex(1000), "us-east"
    cache.store, cache.admission = Store(), Admission()  # type: ignore[assignment]
    cache.policy = lambda: view.current  # type: ignore[assignment,return-value]
    cache.cache_metrics = SimpleNamespace(dropped=lambda why: None)  # type: ignore[assignment]
    for dataset in ("kept", "narrowed", "gone"):
        cache.index.admit(Entry(dataset, "k", entry("k", 10).version))
    sweeper = ResidencySweeper(cache, view)  # type: ignore[arg-type]
    await sweeper.start()
    try:
        await view.publish(Policy(2, {"kept": ("EU", "US"), "narrowed": ("EU",)}))
        await until(lambda: sweeper.sweeps == 1, 10, what="a sweep of revision 2")
    finally:
        await sweeper.stop()
    assert sorted(handed_off) == [("gone", "k"), ("narrowed", "k")]
    assert cache.index.names() == [("kept", "k")]


async def test_a_fill_whose_residency_narrowed_while_it_pulled_is_not_admitted() -> None:
    # A sweep that ran while the bytes came found no entry to drop: the fill checks
    # again before it admits one.
    from agents.transfer.pull import Source

    class Policy:
        revision = 2

        def jurisdiction(self, region: str) -> str:
            return "US"

    class Admission:
        def placement(self, dataset: str) -> SimpleNamespace:
            return SimpleNamespace(residency=("EU",))  # narrowed: no US

    async def pull(*args: object) -> None:
        return None

    async def nothing() -> None:
        return None

    cache = object.__new__(ReadCache)
    cache.index, cache._filling, cache._seen, cache.region = LruIndex(1000), {}, {}, "us-east"
    cache.store, cache.book = object(), object()  # type: ignore[assignment]
    cache.admission = Admission()  # type: ignore[assignment]
    cache.policy = Policy  # type: ignore[assignment]
    cache._pull = pull  # type: ignore[method-assign]
    cache._ship_records = nothing  # type: ignore[method-assign]
    version = entry("k", 10).version
    known = (Source("eu-west", "a:1"), version)
    got = await cache._fill(cast(Placement, None), "d", "k", None, known)
    assert got is None and ("d", "k") not in cache.index
