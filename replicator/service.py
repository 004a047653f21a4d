"""The replicator's consume loop: poll → apply (bounded, ordered per object) → commit.

One consumer group per destination region (`config.group_id`). The loop takes
records of the partitions it is assigned, hands each to the `Applier` through a
`KeyedRunner` (events of one object in log order, of different objects at once),
and a committer commits, per partition, the highest offset whose event and every
earlier one have their durable effect (`OffsetTracker`): never before the agent's
commit. On a rebalance the revoked partitions' events in flight are finished
(within `drain_timeout_s`) and committed before the partitions go; what is not
finished is replayed by the new owner, a no-op by LWW. A stop does the same for
everything, then leaves the group.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence

from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.changelog import ChangeLogConsumer, Record
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.keyed import KeyedRunner
from replicator.metrics import ReplicatorMetrics
from replicator.offsets import OffsetTracker, TopicPartition

log = get_logger("meridian.replicator")


class ReplicatorLoop(Lifecycle):
    """Runs the loop over a started consumer (its owner starts and stops it)."""

    def __init__(
        self,
        config: ReplicatorConfig,
        consumer: ChangeLogConsumer,
        applier: Applier,
        metrics: ReplicatorMetrics,
        *,
        assigned_by_rebalance: bool = True,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self._consumer = consumer
        self._applier = applier
        self._metrics = metrics
        self._runner = KeyedRunner(config.max_in_flight)
        self._offsets = OffsetTracker()
        # With a group consumer, only assigned partitions are taken; a consumer without
        # rebalance callbacks (a test's) takes whatever it returns.
        self._assigned: set[TopicPartition] | None = set() if assigned_by_rebalance else None
        # Makes the effects' records durable (the journal's flush) before offsets go.
        self._before_commit = before_commit
        self._commit_lock = asyncio.Lock()
        self._progress = asyncio.Condition()  # notified each time an event is done
        self._tasks: list[asyncio.Task[None]] = []
        self.handled = 0
        self.failure: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def _do_start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name="replicator-poll"),
            asyncio.create_task(self._commit_loop(), name="replicator-commit"),
        ]

    async def _do_stop(self) -> None:
        poll, *rest = self._tasks
        await cancel_and_wait(poll)
        try:
            async with asyncio.timeout(self.config.drain_timeout_s):
                await self._runner.drain()
        except TimeoutError:
            log.warning(
                "replicator_stop_timeout",
                in_flight=self._runner.active,
                action="cancelled; their offsets stay uncommitted and are replayed",
            )
        await self._runner.cancel()
        await cancel_and_wait(*rest)
        await self._bounded_commit(None, "stop")

    async def wait_handled(self, count: int, timeout_s: float) -> None:
        """Until `count` events have been handled (TimeoutError after `timeout_s`)."""
        async with asyncio.timeout(timeout_s), self._progress:
            await self._progress.wait_for(lambda: self.handled >= count)

    async def wait(self) -> None:
        """Until the loop fails (it never ends by itself)."""
        await asyncio.gather(*self._tasks)

    # -- rebalance (RebalanceHandler) ------------------------------------------------------
    async def on_revoked(self, partitions: set[tuple[str, int]]) -> None:
        if self._assigned is not None:
            self._assigned -= partitions
        try:
            async with asyncio.timeout(self.config.drain_timeout_s), self._progress:
                await self._progress.wait_for(lambda: not self._offsets.in_flight(partitions))
        except TimeoutError:
            log.warning("revoke_drain_timeout", partitions=sorted(partitions))
        await self._bounded_commit(partitions, "revoke")
        self._offsets.forget(partitions)
        log.info("partitions_revoked", partitions=sorted(partitions))

    async def on_assigned(self, partitions: set[tuple[str, int]]) -> None:
        if self._assigned is not None:
            self._assigned |= partitions
        log.info("partitions_assigned", partitions=sorted(partitions))

    # -- the loop ------------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        delay = self.config.retry_initial_s
        while True:
            try:
                records = await self._consumer.poll(
                    self.config.poll_max_records, self.config.poll_timeout_ms
                )
                delay = self.config.retry_initial_s
            except MeridianError as exc:
                if not exc.retriable:
                    raise
                log.warning("poll_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(self.config.retry_max_s, delay * 2)
                continue
            for batch in self._batches(records):
                for record in batch:
                    self._offsets.take((record.topic, record.partition), record.offset)
                await self._runner.submit_many([_object_key(r) for r in batch], _Job(self, batch))

    def _batches(self, records: list[Record]) -> list[list[Record]]:
        """The poll's records of assigned partitions, in poll order (each partition's in
        log order), cut into runs bounded by count and bytes; the applier sends a run's
        inline events to the agent in one call. A run spans partitions: an object's
        events are all in its key's partition, so per-object order is the same, and
        a poll spread over many partitions still makes a few full calls (one run per
        partition gave calls of poll_max_records / partitions events, each paying a
        whole call, transaction and syncfs at the agent)."""
        runs: list[list[Record]] = [[]]
        size = 0
        cfg = self.config
        for record in records:
            tp = (record.topic, record.partition)
            if self._assigned is not None and tp not in self._assigned:
                continue  # revoked while fetched: its new owner takes it
            weight = len(record.value)
            if runs[-1] and (
                len(runs[-1]) >= cfg.batch_max_events or size + weight > cfg.batch_max_bytes
            ):
                runs.append([])
                size = 0
            runs[-1].append(record)
            size += weight
        return [run for run in runs if run]

    async def _run(self, records: list[Record]) -> None:
        def done(indices: Sequence[int]) -> None:
            # As each effect is durable, not when the whole run is: one slow fetch would
            # hold back the commits of every partition in the run.
            for n in indices:
                record = records[n]
                self._offsets.done((record.topic, record.partition), record.offset)

        try:
            await self._applier.handle_many(records, done)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # pragma: no cover - the applier records every failure
            log.exception("apply_crashed", error=str(exc))
            raise
        self.handled += len(records)
        async with self._progress:
            self._progress.notify_all()

    def all_revoked(self, records: Sequence[Record]) -> bool:
        """Whether a rebalance took every partition of `records` from this member."""
        assigned = self._assigned
        return assigned is not None and all((r.topic, r.partition) not in assigned for r in records)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_s)
            await self.commit()

    async def _bounded_commit(self, partitions: set[TopicPartition] | None, why: str) -> None:
        """`commit`, for at most `drain_timeout_s`: the Kafka client retries a commit for
        as long as Kafka is away, and a stop (SIGTERM) or a rebalance must end anyway.
        What it did not commit is replayed by the next owner (a no-op by LWW)."""
        try:
            async with asyncio.timeout(self.config.drain_timeout_s):
                await self.commit(partitions)
        except TimeoutError:
            log.warning(
                "commit_timeout",
                at=why,
                seconds=self.config.drain_timeout_s,
                action="left uncommitted: replayed by the next owner, a no-op",
            )

    async def commit(self, partitions: set[TopicPartition] | None = None) -> None:
        """Commit every offset whose effect is durable (of `partitions`, or all)."""
        async with self._commit_lock:
            ready = {
                tp: off
                for tp, off in self._offsets.committable().items()
                if (partitions is None or tp in partitions)
                and (self._assigned is None or tp in self._assigned or tp in (partitions or ()))
            }
            if not ready:
                return
            marks = [Record(tp[0], tp[1], off, None, b"") for tp, off in ready.items()]
            if self._before_commit is not None:
                await self._before_commit()
            try:
                await self._consumer.commit(marks)
            except MeridianError as exc:
                # A rebalance under way, or Kafka away: the offsets are committed later,
                # or replayed by the next owner (a no-op).
                log.warning("commit_failed", error=str(exc), offsets=len(marks))
                return
            for tp, off in ready.items():
                self._offsets.committed(tp, off)
            self._metrics.committed_offsets.inc()


class _Job:
    """Submitted records (a run of one poll), as a callable the runner awaits."""

    def __init__(self, loop: ReplicatorLoop, records: list[Record]) -> None:
        self._loop = loop
        self._records = records

    async def __call__(self) -> None:
        # A run that crashed (a bug: the applier handles every failure of an event) is
        # run again after a backoff, never dropped: a dropped run's events would be left
        # undone, and its partitions' offsets never committed again. Running it again
        # is safe (every effect is idempotent); until stopped, it holds later events of
        # its objects back, and says so at every try (apply_crashed, apply_retry).
        cfg = self._loop.config
        delay = cfg.retry_initial_s
        for attempt in itertools.count(1):
            try:
                await self._loop._run(self._records)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged in _run
                if self._loop.all_revoked(self._records):
                    # Another member owns them now and replays them from its commit.
                    log.warning("apply_abandoned", records=len(self._records), attempt=attempt)
                    return
                log.warning(
                    "apply_retry", records=len(self._records), attempt=attempt, retry_in_s=delay
                )
                await asyncio.sleep(delay)
                delay = min(cfg.retry_max_s, delay * 2)


def _object_key(record: Record) -> str:
    """One object's events share the Kafka key `dataset/key`; order within it."""
    if record.key:
        return record.key.decode("utf-8", "replace")
    return f"{record.topic}/{record.partition}"  # no key: keep the partition's order
