"""`Invalidator`: reads the change log (Kafka `meridian.changes`) and tells the cache of
every version written, so that an entry older than a new write is dropped.

Its consumer group is this agent's own (`meridian-cache-<region>-<agent>`), moved to the
log's end before it starts (the cache starts empty, so nothing older matters), and it
never commits: a restart begins at the end again. While the log cannot be read (Kafka
down, a broken consumer) the cache is told so (`log_lost`) and revalidates every hit at
a holder instead of trusting its entries; the consumer is restarted with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from agents.cache.cache import ReadCache
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaConsumer, fast_forward_group
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from meridian.convert import decode_change_event

log = get_logger("meridian.agent.cache.changelog")

_POLL_RECORDS = 500
_POLL_MS = 500


class Invalidator(Lifecycle):
    def __init__(
        self,
        cache: ReadCache,
        bootstrap: Sequence[tuple[str, int]] | str,
        group_id: str,
        *,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 10.0,
    ) -> None:
        self.cache = cache
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self._task: asyncio.Task[None] | None = None

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cache-invalidator")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        self.cache.log_lost()

    async def _run(self) -> None:
        delay = self.retry_initial_s
        while True:
            try:
                await self._consume()
            except MeridianError as exc:
                self.cache.log_lost()
                log.warning("cache_changelog_unreadable", error=str(exc), retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)

    async def _consume(self) -> None:
        await fast_forward_group(self.bootstrap, self.group_id, CHANGES_TOPIC.name)
        assigned = _Assigned()
        consumer = KafkaConsumer(
            self.bootstrap, topics=[CHANGES_TOPIC.name], group_id=self.group_id, rebalance=assigned
        )
        await consumer.start()
        try:
            log.info("cache_changelog_reading", group=self.group_id)
            current = False
            while True:
                records = await consumer.poll(_POLL_RECORDS, _POLL_MS)
                for record in records:
                    try:
                        event = decode_change_event(record.value)
                    except MeridianError:
                        continue  # the replicators dead-letter it; nothing to invalidate
                    await self.cache.notice(event.dataset, event.key, event.version.hlc)
                if assigned.partitions:  # reading from the log's end: entries current
                    if not current:
                        current = True
                        log.info("cache_changelog_current", group=self.group_id)
                    self.cache.log_read()
                else:
                    self.cache.log_lost()
        finally:
            self.cache.log_lost()
            with contextlib.suppress(MeridianError):
                await consumer.stop()


class _Assigned:
    """The consumer's partitions: until the group gave it some, nothing is read yet."""

    def __init__(self) -> None:
        self.partitions: set[tuple[str, int]] = set()

    async def on_revoked(self, partitions: set[tuple[str, int]]) -> None:
        self.partitions -= partitions

    async def on_assigned(self, partitions: set[tuple[str, int]]) -> None:
        self.partitions |= partitions
