"""The per-link bandwidth cap: honoured within a tolerance, shared by the transfers
on a link (not per transfer), independent between links, critical before standard."""

from __future__ import annotations

import asyncio
import time

from agents.transfer.limiter import LinkLimiter

RATE = 4 << 20  # bytes per second
CHUNK = 256 << 10


async def _send(
    limiter: LinkLimiter,
    a: str,
    b: str,
    total: int,
    *,
    critical: bool,
    sending: asyncio.Event | None = None,
) -> float:
    """When it is done; `sending` is set once its first chunk has the link."""
    sent = 0
    while sent < total:
        await limiter.acquire(a, b, CHUNK, RATE, critical=critical)
        sent += CHUNK
        if sending is not None:
            sending.set()
    return time.monotonic()


async def test_one_transfer_is_held_to_the_rate() -> None:
    limiter = LinkLimiter()
    begin = time.monotonic()
    await _send(limiter, "eu-west", "eu-central", 2 * RATE, critical=False)
    elapsed = time.monotonic() - begin
    # 2 s of bytes at the rate; loose above, as every sleep overshoots on a loaded machine
    assert 1.85 <= elapsed <= 4.0


async def test_transfers_on_one_link_share_its_rate_and_links_are_separate() -> None:
    limiter = LinkLimiter()
    begin = time.monotonic()
    # Two on eu-west <-> eu-central (either direction is the same link), one elsewhere.
    ends = await asyncio.gather(
        _send(limiter, "eu-west", "eu-central", RATE, critical=False),
        _send(limiter, "eu-central", "eu-west", RATE, critical=False),
        _send(limiter, "eu-west", "us-east", RATE, critical=False),
    )
    shared = max(ends[:2]) - begin
    alone = ends[2] - begin
    assert shared >= 1.85  # 2 x RATE bytes through one RATE link
    assert alone >= 0.85
    # The other link is not held back by this one's pair: it ends about a second before
    # them. (Relative, and loose above: on a loaded machine every sleep overshoots.)
    assert shared - alone >= 0.6, (shared, alone)
    assert shared <= 3.5, shared


async def test_critical_goes_before_standard_on_a_busy_link() -> None:
    limiter = LinkLimiter()
    begin = time.monotonic()
    sending = asyncio.Event()
    backfill = asyncio.ensure_future(
        _send(limiter, "eu-west", "eu-central", 2 * RATE, critical=False, sending=sending)
    )
    await asyncio.wait_for(sending.wait(), 5)  # the backfill has the link
    checkpoint_done = await _send(limiter, "eu-west", "eu-central", RATE // 2, critical=True)
    backfill_done = await backfill
    # The checkpoint's half second of bytes is served at once, not after the backfill's
    # remaining 1.9 s or so: FIFO would finish it at about 2.5 s.
    assert checkpoint_done - begin <= 1.7  # loose for load, still well before FIFO's 2.5 s
    assert backfill_done - begin >= 2.4  # the backfill waited for it (the link is shared)


async def test_a_new_link_sends_its_first_burst_at_once() -> None:
    """A link never used starts as an idle one, with its burst in the bucket: the first
    chunk does not wait (an empty start held every first transfer back a chunk's time)."""
    limiter = LinkLimiter(burst_s=0.5)
    rate = 256 << 10  # 128 KiB of burst; an empty bucket would make 64 KiB wait 0.25 s
    begin = time.monotonic()
    await limiter.acquire("eu-west", "eu-central", 64 << 10, rate, critical=False)
    assert time.monotonic() - begin < 0.2  # an empty bucket would wait 0.25 s
    begin = time.monotonic()
    await limiter.acquire("eu-west", "eu-central", 128 << 10, rate, critical=False)
    assert time.monotonic() - begin >= 0.2  # then the rate holds: the burst is spent
