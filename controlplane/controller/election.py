"""Election and liveness: one active controller per region, for as long as its lease lives.

The controller campaigns for its region's election lock
(`/meridian/regions/<region>/election/`); once granted, it writes the liveness key
`/meridian/regions/<region>/alive` under the same lease and serves a `Term` until
the lease is lost. Only that ends a term: the keepalive reporting the lease gone
(or not renewed for a whole TTL), or the lock key deleted by an operator. etcd
errors while campaigning or while writing the liveness key are retried with
backoff, and errors inside the term are the duties' own, so a transient etcd
error never ends a term. A term ended by an etcd outage leaves its lease to the
next campaign, which takes it up while etcd still has it (`GlobalLock`: the
liveness key then never vanishes, and no region reads the outage as a death);
stopping the controller revokes it. If a standby controller of the region waits
meanwhile, the campaign queues behind it (a controller that stalls for a TTL again
and again must not keep it out): the standby's term overwrites the liveness key
under its own lease, so it never vanishes either, and starts as `took_over`. So
after an etcd outage a region with a standby changes controllers; until the one
ahead (a standby that died meanwhile: its lease outlives it by a TTL) is granted or
gone, the region has no active controller, and its liveness key stays.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from controlplane.controller.config import ControllerContext, Term
from controlplane.controller.duty import Backoff, describe, is_retriable
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.locks import GlobalLock, HeldLock, LockLostError
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import KeyValue, Put

log = get_logger("meridian.controller")

Serve = Callable[[Term], Awaitable[None]]


class Election(Lifecycle):
    """Campaigns, holds the lease, and runs `serve(term)` for each term it wins.

    `serve` runs until cancelled; `on_step_down(why)` is called when a term ends
    (or a campaign fails) so the daemon can forget what the term owned."""

    def __init__(
        self, ctx: ControllerContext, serve: Serve, on_step_down: Callable[[str], None]
    ) -> None:
        self.ctx = ctx
        self._serve = serve
        self._on_step_down = on_step_down
        self._task: asyncio.Task[None] | None = None

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(
            self._campaign(), name=f"election-{self.ctx.config.region}"
        )

    async def _do_stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _campaign(self) -> None:
        cfg = self.ctx.config
        lock = GlobalLock(
            self.ctx.coord,
            f"controller-{cfg.region}",
            ttl_s=cfg.lease_ttl_s,
            prefix=keys.election(cfg.region),
        )
        value = json.dumps({"id": cfg.controller_id}).encode()
        backoff = Backoff(cfg.retry_initial_s, min(1.0, cfg.lease_ttl_s / 5))
        try:
            await self._terms(lock, value, backoff)
        finally:
            await lock.abandon()  # stopping: a standby (or a failover) need not wait a TTL

    async def _terms(self, lock: GlobalLock, value: bytes, backoff: Backoff) -> None:
        while True:
            try:
                async with lock.hold(value=value) as held:
                    term = await self._begin(held)
                    backoff.reset()
                    await self._serve(term)
            except LockLostError as exc:
                self._on_step_down(str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd unreachable while campaigning
                self._on_step_down(describe(exc))
                delay = backoff.next(retriable=is_retriable(exc))
                log.warning(
                    "campaign_retry",
                    region=self.ctx.config.region,
                    error=describe(exc),
                    retriable=is_retriable(exc),
                    retry_in_s=round(delay, 3),
                )
                await asyncio.sleep(delay)

    async def _begin(self, held: HeldLock) -> Term:
        """Write the liveness key under the lease, retrying etcd errors while it holds
        (the lock's monitor cancels this task if the lease is lost meanwhile)."""
        cfg = self.ctx.config
        coord = self.ctx.coord
        alive = keys.alive(cfg.region)
        doc = {"controller": cfg.controller_id, "since": rfc3339(utcnow())}
        backoff = Backoff(cfg.retry_initial_s, min(1.0, cfg.lease_ttl_s / 5))
        # Read once, before our first write: a retry after a write whose answer was
        # lost would find our own key.
        before: KeyValue | None = None
        read_before = False
        while True:
            try:
                if not read_before:
                    before, read_before = await coord.get(alive), True
                await coord.txn([], [Put(alive, json.dumps(doc).encode(), held.lease.id)])
                kv = await coord.get(alive)
                break
            except LockLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried while the keepalive holds
                delay = backoff.next(retriable=is_retriable(exc))
                log.warning("liveness_write_retry", region=cfg.region, error=describe(exc))
                await asyncio.sleep(delay)
        if kv is None or kv.lease != held.lease.id:
            raise LockLostError("our liveness key vanished right after it was written")
        took_over = before is not None and before.lease != held.lease.id
        term = Term(held.lease.id, kv.create_revision, time.monotonic(), kv.mod_revision, took_over)
        log.info(
            "became_active",
            region=cfg.region,
            id=cfg.controller_id,
            lease=f"{held.lease.id:x}",
            revision=kv.mod_revision,
            resumed=held.resumed,
            took_over=took_over,
        )
        return term
