"""The cache's Prometheus series, on the agent's registry (its `--metrics` endpoint):
`meridian_cache_bytes`, `meridian_cache_limit_bytes`, `meridian_cache_objects`
(read at scrape time), `meridian_cache_reads_total{result="hit"|"miss"}` and
`meridian_cache_dropped_total{why}` (evicted, invalidated, ...)."""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge


class _Counters(Protocol):
    hits: int
    misses: int


class _Cache(Protocol):
    @property
    def limit_bytes(self) -> int: ...

    @property
    def counters(self) -> _Counters: ...

    def report(self) -> dict[str, object]: ...


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry, cache: _Cache) -> None:
        self.bytes = Gauge(
            "meridian_cache_bytes", "bytes held by the read cache", registry=registry
        )
        self.bytes.set_function(lambda: float(_int(cache.report()["bytes"])))
        self.limit = Gauge(
            "meridian_cache_limit_bytes", "the read cache's bound", registry=registry
        )
        self.limit.set_function(lambda: float(cache.limit_bytes))
        self.objects = Gauge(
            "meridian_cache_objects", "objects held by the read cache", registry=registry
        )
        self.objects.set_function(lambda: float(_int(cache.report()["objects"])))
        self.reads = Counter(
            "meridian_cache_reads_total",
            "reads through the cache, by result",
            ["result"],
            registry=registry,
        )
        self.reads.labels(result="hit")
        self.reads.labels(result="miss")
        self.drops = Counter(
            "meridian_cache_dropped_total",
            "cached objects removed, by why (evicted, invalidated, ...)",
            ["why"],
            registry=registry,
        )

    def read(self, hit: bool) -> None:
        self.reads.labels(result="hit" if hit else "miss").inc()

    def dropped(self, why: str) -> None:
        self.drops.labels(why=why).inc()


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0
