"""`Prefetcher`: a reader walking a dataset in key order gets the next objects fetched
ahead of it, so sequential reads stream rather than wait one round trip per shard.

After a read of `key` that follows a read of a smaller key of the same dataset (a
walk), the nearest holder is asked for the next `depth` objects after `key` (one List,
in the background) and those not cached yet are filled, at most `parallel` at once.
Bounded: at most `depth` objects and half the cache's bound ahead of the reader, and a
prefetch that fails is only logged (the reader fetches the object itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Coroutine

from agents.cache.cache import ReadCache
from agents.transfer.pull import Source
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import MeridianError
from controlplane.lifecycle import cancel_and_wait
from controlplane.logs import get_logger
from meridian.convert import version_from_wire

log = get_logger("meridian.agent.cache.prefetch")

_WALKS_MAX = 1024  # datasets whose last read key is remembered


class Prefetcher:
    def __init__(self, cache: ReadCache, depth: int, *, parallel: int = 4) -> None:
        self.cache = cache
        self.depth = depth
        self._slots = asyncio.Semaphore(parallel)
        self._last: OrderedDict[str, str] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._listing: set[str] = set()
        self.started = 0  # prefetch fills begun (for tests and the benchmark)
        cache.on_read = self.on_read

    def on_read(self, placement: Placement, dataset: str, key: str) -> None:
        last = self._last.get(dataset)
        self._last[dataset] = key
        self._last.move_to_end(dataset)
        while len(self._last) > _WALKS_MAX:
            self._last.popitem(last=False)
        if self.depth < 1 or last is None or key <= last or dataset in self._listing:
            return
        self._listing.add(dataset)
        self._spawn(self._ahead(placement, dataset, key))

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ahead(self, placement: Placement, dataset: str, key: str) -> None:
        try:
            sources = await self.cache.sources(placement)
            if not sources:
                return
            source = sources[0]
            budget = self.cache.limit_bytes // 2
            for info in await self.cache.list_after(source, dataset, key, self.depth):
                version = version_from_wire(info.version, "ObjectInfo.version")
                held = self.cache.index.peek((dataset, info.key))
                if held is not None and held.version == version:
                    budget -= version.size
                    continue
                if version.is_tombstone or version.size > budget:
                    break
                budget -= version.size
                self._spawn(self._one(placement, dataset, info.key, source, version))
        except MeridianError as exc:
            log.info("prefetch_list_failed", dataset=dataset, after=key, error=str(exc))
        finally:
            self._listing.discard(dataset)

    async def _one(
        self, placement: Placement, dataset: str, key: str, source: Source, version: Version
    ) -> None:
        async with self._slots:
            if (dataset, key) in self.cache.index:
                return
            self.started += 1
            try:
                await self.cache.fill(placement, dataset, key, None, known=(source, version))
                log.info("prefetched", dataset=dataset, key=key, version=str(version.hlc))
            except MeridianError as exc:
                log.info("prefetch_failed", dataset=dataset, key=key, error=str(exc))

    async def stop(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await cancel_and_wait(task)
