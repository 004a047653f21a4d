"""The owner's push lane to one replica region (issue 13): group commit of critical
pushes without waiting to fill a batch.

A push that finds no call running to that region goes at once, alone, as a
`ReplicatePushes` of one item (one unary message: a streamed `Replicate` costs both
agents more CPU for the same bytes, and a lone write is no slower). Otherwise it
queues, and the queue goes out in ONE `ReplicatePushes` call (at most `most` items and
`BATCH_BYTES`, each (dataset, key) once: a second version of a key waits for the
next call, so a replica applies a key's versions in the order they were pushed),
which the replica fences and commits in one store transaction, answering per item
(replica_pushes.py) as soon as a call slot is free (fewer than `in_flight` calls
running) and the queue is worth a call: while other calls run, a short queue waits
up to `LINGER_S` for more, when the lane's recent calls carried several versions
each (`_worth`). So under load each round trip carries the writes that arrived
meanwhile, and the replica's owner read and commit are paid once per call rather
than once per write; and a slot is not spent on a lone write just before the rest
of its wave arrives (under 32 writers, greedily, a third of the calls carried one
version, and the wave behind it waited for the next slot: 15 ms of a write's 50).
A lane with nothing running, whose calls carry under about 1.5 versions, or whose
region takes no batch, never waits.

A push that waits its whole deadline in the queue (the calls ahead hang: a region
cut off) fails there, unsent: the region is caught up instead, and the queue holds
no more than a deadline's worth of pushes.

Each item keeps its own answer (committed there, or the error that says why not),
so `SyncReplication._ordered` still counts a region toward a write's ack only once
every earlier push to it has succeeded, and a failed item marks the region behind.
A replica agent that takes no batch (UNIMPLEMENTED: one of a region of several, or
an older agent) gets its items pushed alone as `Replicate`, and no batch for
`REFUSED_FOR_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents.metrics import AgentMetrics
from agents.replication.delta_push import DELTA_MIN_BYTES
from agents.service.servicer import CommittedWrite
from controlplane.domain.version import Version
from controlplane.errors import MeridianError, UnavailableError

BATCH_MAX = 64  # items in one call
BATCH_BYTES = 1 << 20  # bytes of data in one call (well under the 4 MiB message cap)
BATCH_ITEM_MAX = DELTA_MIN_BYTES  # larger versions go alone (and may go as a delta)
IN_FLIGHT = 3  # calls running to one region before pushes queue
# While a call runs, a queue shorter than min(LINGER_UP_TO, the versions the lane's
# calls recently carried) waits up to LINGER_S for more before taking a free slot.
# Tuned with benchmarks/critical_bench.py --quick (32 writers, 20 ms RTT; 2026-12-05,
# benchmarks/critical_bench_results.txt): 638 acked/s greedily at 2 in flight (the mean
# of 6 runs), 718 with these (of 2); a push's wait for a call 15 -> 7 ms.
LINGER_S = 0.006
LINGER_UP_TO = 8
CARRIED_WEIGHT = 0.1  # of each call in the running mean of the versions a call carries
REFUSED_FOR_S = 30.0

Alone = Callable[[CommittedWrite, Version, float], Awaitable[str]]
Together = Callable[
    [list[tuple[CommittedWrite, Version]], float], Awaitable[list[MeridianError | None]]
]


class BatchRefusedError(UnavailableError):
    """The replica agent takes no ReplicatePushes (it answered UNIMPLEMENTED)."""


@dataclass(slots=True)
class _Queued:
    write: CommittedWrite
    version: Version
    deadline_s: float
    answer: asyncio.Future[str]
    since: float  # the lane's clock when it queued


class _Timed:
    """A lane's histograms (`meridian_critical_push_seconds`, `..._items`), their
    children looked up once: every acked write observes them."""

    def __init__(self, metrics: AgentMetrics, region: str) -> None:
        self.queued = metrics.push_seconds.labels(to_region=region, stage="queued").observe
        self.called = metrics.push_seconds.labels(to_region=region, stage="call").observe
        self.carried = metrics.push_items.labels(to_region=region).observe


class PushLane:
    """See the module docstring."""

    def __init__(
        self,
        region: str,
        *,
        alone: Alone,
        together: Together,
        most: int = BATCH_MAX,
        in_flight: int = IN_FLIGHT,
        linger_s: float = LINGER_S,
        clock: Callable[[], float] = time.monotonic,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.region = region
        self._alone = alone
        self._together = together
        self.most = most
        self.in_flight = in_flight
        self.linger_s = linger_s
        self._clock = clock
        self._running = 0
        self._queue: deque[_Queued] = deque()
        self._calls: set[asyncio.Future[Any]] = set()
        self._refused_until = 0.0
        self.batches = 0  # calls that carried more than one item (for tests, metrics)
        self._carried = 1.0  # running mean of the versions a call carried
        self._linger: asyncio.TimerHandle | None = None
        self._timed = _Timed(metrics, region) if metrics is not None else None

    @property
    def queued(self) -> int:
        """Pushes waiting for a call slot (for tests)."""
        return len(self._queue)

    def submit(
        self, write: CommittedWrite, version: Version, deadline_s: float
    ) -> asyncio.Future[str]:
        """`push`, started now, as the future of its answer: a queued push's is a plain
        future the call settles, with no task of its own (every acked write pushes to
        each replica, and a task per push was a tenth of an owner's loop)."""
        if not self._queue and (
            self._running == 0 or (self._running < self.in_flight and self._worth() <= 1)
        ):
            self._running += 1
            self._count(1)
            if self._timed is not None:
                self._timed.queued(0.0)
            task = asyncio.ensure_future(self._one(write, version, deadline_s))
            # Its slot is given back when it ends, however (even cancelled before its
            # first step, when a `finally` inside it would never run); close() ends it.
            self._calls.add(task)
            task.add_done_callback(self._ended_alone)
            return task
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(write, version, deadline_s, answer, self._clock()))
        self._drain()
        return answer

    def _ended_alone(self, task: asyncio.Future[str]) -> None:
        self._calls.discard(task)
        self._running -= 1
        self._drain()

    async def _one(self, write: CommittedWrite, version: Version, deadline_s: float) -> str:
        """One push in a call of its own: a batch of one, or `Replicate` while the
        region takes no batch."""
        if self._clock() >= self._refused_until:
            try:
                answers = await self._call_together([(write, version)], deadline_s)
            except BatchRefusedError:
                self._refused_until = self._clock() + REFUSED_FOR_S
            else:
                if answers[0] is not None:
                    raise answers[0]
                return self.region
        return await self._call_alone(write, version, deadline_s)

    # Each call to the region, timed from its start to its answer, with the versions it
    # carries counted as it starts: every push has waited once (stage="queued") and been
    # carried once by then, and twice when the region refused its batch (a refused
    # ReplicatePushes went out too).
    async def _call_together(
        self, items: list[tuple[CommittedWrite, Version]], deadline_s: float
    ) -> list[MeridianError | None]:
        if self._timed is None:
            return await self._together(items, deadline_s)
        started = self._clock()
        self._timed.carried(len(items))
        try:
            return await self._together(items, deadline_s)
        finally:
            self._timed.called(self._clock() - started)

    async def _call_alone(self, write: CommittedWrite, version: Version, deadline_s: float) -> str:
        if self._timed is None:
            return await self._alone(write, version, deadline_s)
        started = self._clock()
        self._timed.carried(1)
        try:
            return await self._alone(write, version, deadline_s)
        finally:
            self._timed.called(self._clock() - started)

    def _worth(self) -> int:
        """How many queued versions make a call worth a slot while others run: what
        the lane's calls have recently carried, at most LINGER_UP_TO."""
        return min(LINGER_UP_TO, round(self._carried))

    def _count(self, items: int) -> None:
        self._carried += CARRIED_WEIGHT * (items - self._carried)

    def _holds(self, waited: bool) -> bool:
        """Whether the queue waits for more before taking a free slot (module docstring):
        not when nothing runs, when its oldest push has waited the linger, or while the
        region takes no batch (each item then goes in a call of its own anyway)."""
        if self._running == 0 or waited or self._clock() < self._refused_until:
            return False
        return len(self._queue) < self._worth()

    def _drain(self, *, waited: bool = False) -> None:
        while self._running < self.in_flight and self._queue:
            if self._holds(waited):
                left = min(self.linger_s, self._queue[0].since + self.linger_s - self._clock())
                if left > 0:
                    if self._linger is None:
                        loop = asyncio.get_running_loop()
                        self._linger = loop.call_later(left, self._lingered)
                    return
            batch = self._take()
            if not batch:
                continue
            if self._linger is not None:
                # Armed for a push that goes now: the next one waits its own linger.
                self._linger.cancel()
                self._linger = None
            self._running += 1
            self._count(len(batch))
            task = asyncio.create_task(self._send(batch), name=f"pushes to {self.region}")
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    def _lingered(self) -> None:
        self._linger = None
        self._drain(waited=True)  # the oldest has waited long enough, by the loop's clock

    def _take(self) -> list[_Queued]:
        """The queued pushes of the next call, oldest first (cancelled ones dropped, and
        those queued for their whole deadline failed)."""
        batch: list[_Queued] = []
        names: set[tuple[str, str]] = set()
        size = 0
        kept: deque[_Queued] = deque()
        now = self._clock()
        while self._queue and len(batch) < self.most:
            queued = self._queue.popleft()
            if queued.answer.done():
                continue
            if now - queued.since >= queued.deadline_s:
                # Its whole deadline spent queued (the calls ahead hang: a region cut
                # off): failed, not sent, so the region is caught up instead and the
                # queue holds no more than a deadline's worth of pushes.
                self._settle(
                    queued.answer,
                    UnavailableError(
                        f"the push to {self.region} waited its whole deadline "
                        f"({queued.deadline_s:.1f} s) for a call, behind calls that did "
                        "not end; it was not sent"
                    ),
                )
                continue
            name = (queued.write.dataset, queued.write.key or "")
            if name in names:
                kept.append(queued)  # the next call: one version of a key per call
                continue
            if batch and size + queued.version.size > BATCH_BYTES:
                kept.append(queued)  # full: it and what is left stay in order
                break
            names.add(name)
            size += queued.version.size
            batch.append(queued)
        kept.extend(self._queue)
        self._queue = kept
        return batch

    async def _send(self, batch: list[_Queued]) -> None:
        if self._timed is not None:
            now = self._clock()
            for queued in batch:
                self._timed.queued(now - queued.since)
        try:
            if self._clock() < self._refused_until:
                await self._each_alone(batch)
                return
            items = [(q.write, q.version) for q in batch]
            try:
                answers = await self._call_together(items, max(q.deadline_s for q in batch))
            except BatchRefusedError:
                self._refused_until = self._clock() + REFUSED_FOR_S
                await self._each_alone(batch)
                return
            except Exception as exc:  # noqa: BLE001 - the call failed: so did each item (handed on)
                for queued in batch:
                    self._settle(queued.answer, exc)
                return
            if len(batch) > 1:
                self.batches += 1
            for queued, error in zip(batch, answers, strict=True):
                self._settle(queued.answer, error)
        finally:
            self._running -= 1
            for queued in batch:  # cancelled (closing): nobody waits in vain
                if not queued.answer.done():
                    queued.answer.cancel()
            self._drain()

    async def _each_alone(self, batch: list[_Queued]) -> None:
        async def one(queued: _Queued) -> None:
            try:
                await self._one(queued.write, queued.version, queued.deadline_s)
            except Exception as exc:  # noqa: BLE001 - handed to the push waiting for it
                self._settle(queued.answer, exc)
            else:
                self._settle(queued.answer, None)

        await asyncio.gather(*(one(q) for q in batch))

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        for queued in self._queue:
            queued.answer.cancel()
        self._queue.clear()
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        for task in calls:
            with contextlib.suppress(BaseException):
                await task

    def _settle(self, answer: asyncio.Future[str], error: BaseException | None) -> None:
        if answer.done():
            return
        if error is None:
            answer.set_result(self.region)
        else:
            answer.set_exception(error)
