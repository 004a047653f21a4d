"""Bandwidth caps per link: one token bucket per pair of regions, shared by every
transfer on that link, with critical transfers served before standard ones.

Why priority and not FIFO: a critical checkpoint must not wait behind a corpus
backfill on the same link (issue 10). Waiters queue by class; only the head of the
highest non-empty class may take tokens, so a critical chunk that arrives while a
standard one waits for its tokens goes first.

The bucket holds at most `burst_s` seconds of the rate (at least one chunk), so an
idle link cannot save up a long burst that would overrun the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field

from controlplane.errors import InvalidInputError

CHUNK_BYTES = 1 << 20
DEFAULT_BURST_S = 0.05


@dataclass
class _Bucket:
    rate: float
    tokens: float
    stamp: float
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    queues: tuple[deque[object], deque[object]] = field(default_factory=lambda: (deque(), deque()))

    def refill(self, now: float, cap: float) -> None:
        self.tokens = min(cap, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def head(self) -> object | None:
        for queue in self.queues:
            if queue:
                return queue[0]
        return None


class LinkLimiter:
    """`await acquire(a, b, nbytes, rate_bps, critical=...)` before sending `nbytes`
    over the link between regions a and b. `rate_bps` None means no cap (returns at
    once). The rate of a link is the latest one given (the policy may change it)."""

    def __init__(self, *, burst_s: float = DEFAULT_BURST_S) -> None:
        if burst_s <= 0:
            raise InvalidInputError(f"burst_s must be > 0, got {burst_s}")
        self.burst_s = burst_s
        self._buckets: dict[frozenset[str], _Bucket] = {}

    async def acquire(
        self, a: str, b: str, nbytes: int, rate_bps: float | None, *, critical: bool
    ) -> None:
        if rate_bps is None or nbytes <= 0:
            return
        link = frozenset((a, b))
        bucket = self._buckets.get(link)
        now = time.monotonic()
        if bucket is None:
            # A new link starts as an idle one: with the burst it may hold (it used to
            # start empty, so every first transfer on a link waited one chunk's time).
            bucket = _Bucket(rate=rate_bps, tokens=rate_bps * self.burst_s, stamp=now)
            self._buckets[link] = bucket
        bucket.rate = rate_bps
        cap = max(float(min(nbytes, CHUNK_BYTES)), rate_bps * self.burst_s)
        need = min(float(nbytes), cap)
        me = object()
        queue = bucket.queues[0 if critical else 1]
        async with bucket.cond:
            queue.append(me)
            try:
                while True:
                    if bucket.head() is me:
                        bucket.refill(time.monotonic(), cap)
                        if bucket.tokens >= need:
                            # A message larger than the bucket is paid in full: the
                            # balance goes negative and later senders wait it out.
                            bucket.tokens -= nbytes
                            return
                        wait = (need - bucket.tokens) / bucket.rate
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(bucket.cond.wait(), wait)
                    else:
                        await bucket.cond.wait()
            finally:
                queue.remove(me)
                bucket.cond.notify_all()
