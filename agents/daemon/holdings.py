"""`HoldingsPublisher`: this agent's holdings of critical datasets, kept in etcd.

For every critical dataset this agent holds and whose placement includes its
region, one record (controlplane/coordination/protocols/holdings.py) under a lease
of the publisher's own, so it vanishes with the agent (SIGKILL: within the TTL;
SIGTERM: at once, the lease is revoked). A failover controller compares the
records of the live candidate regions and prefers one that holds every acked
version.

Cheap on the write path: nothing is done inside a commit. Every `interval_s` the
publisher reads one counter of the store (`change_seq`, grown by every commit);
only when it moved are the critical datasets summarised again (a paged listing of
the stored text: count, newest HLC, digest of the listing), and a record is written
only when its summary changed. So a burst of thousands of commits costs one listing
and one etcd put per dataset per interval, and an idle agent costs one SQLite read.
A listing costs in proportion to the objects held, so under a steady stream of
writes the passes are paced by their own cost (`PACE_FACTOR`, `PACE_MAX_S`): in the
critical bench (3,200 objects, every pass a change) they took a third of a
replica's CPU before the listing stopped parsing every row and the pace held.

`UnackedWrites` wraps the replication hook of the servicer: a critical write this
agent committed whose ack failed (its client was told "not acked, retry") is
remembered, and published in the record's `unacked` while it is still the newest
version of its object here. The failover does not count such a version as lost
when the new owner lacks it (it was never acked); without that mark a version only
the old owner held, committed just as a handover froze the dataset, would look
like a lost ack. The marks are in memory: after a restart they are gone, and the
exposure is then over-counted, never under-counted.

A lost lease (etcd away for a whole TTL) is granted again and every record written
again; an etcd error is logged and retried with backoff, never fatal: serving
writes matters more than describing them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from agents.service.servicer import CommittedWrite, Replication
from agents.store import ObjectStore
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.holdings import (
    HoldingRecord,
    holding_key,
    listing_digest,
)
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Coordination, KeepAlive

log = get_logger("meridian.agent.holdings")

_PAGE = 1000
# The summaries take at most about 1/PACE_FACTOR of a core: the next pass waits
# PACE_FACTOR times the CPU the last one took (at most PACE_MAX_S, so a record is
# never older than that plus a pass while anything changes; the failover reads them
# a lease TTL after a death, when nothing changes any more). At 10 they were an eighth
# of a critical owner's CPU under 32 writers; at 20 still 5 % of a core in each of the
# bench's three agents (7 ms a pass over 3,200 objects, 7 passes a second).
PACE_FACTOR = 100.0
PACE_MAX_S = 1.0
UNACKED_KEPT = 1000  # marks kept per dataset (the oldest are forgotten first)


class UnackedWrites:
    """The servicer's replication hook, remembering the writes whose ack failed."""

    def __init__(self, inner: Replication) -> None:
        self.inner = inner
        self.marks: dict[str, dict[str, str]] = {}  # dataset -> key -> HLC text

    async def replicate(self, write: CommittedWrite) -> tuple[str, ...]:
        try:
            return await self.inner.replicate(write)
        except BaseException:
            if write.key is not None and write.version is not None:
                marks = self.marks.setdefault(write.dataset, {})
                marks.pop(write.key, None)
                marks[write.key] = write.version.hlc.text
                while len(marks) > UNACKED_KEPT:
                    del marks[next(iter(marks))]
            raise

    def still_newest(self, dataset: str, newest: dict[str, str]) -> list[str]:
        """`key@hlc` of the marks of `dataset` still the newest version of their object
        (`newest`: key -> HLC text); the others are forgotten."""
        marks = self.marks.get(dataset)
        if not marks:
            return []
        for key in [k for k, hlc in marks.items() if newest.get(k) != hlc]:
            del marks[key]
        return [f"{k}@{h}" for k, h in sorted(marks.items())]


Summary = tuple[int, str | None, str, dict[str, str]]


def summarise(store: ObjectStore, dataset: str) -> Summary:
    """(objects, newest HLC text or None, listing digest, key -> newest HLC text) of
    `dataset` in `store`. From the store's text (`listing`), never parsed: this runs
    over every object of every critical dataset whenever anything changed."""
    entries: list[tuple[str, str, str]] = []
    newest: str | None = None
    after = ""
    for _page in range(1_000_000):  # bounded: a listing that never ends is a bug
        page = store.listing(dataset, after, _PAGE)
        for key, hlc, digest in page:
            entries.append((key, hlc, digest or ""))
            if newest is None or hlc > newest:
                newest = hlc  # HLC text sorts as the HLC does
        if len(page) < _PAGE:
            break
        after = page[-1][0]
    return len(entries), newest, listing_digest(entries), {k: h for k, h, _ in entries}


class HoldingsPublisher(Lifecycle):
    """See the module docstring. `policy` gives the applied policy (None: none yet)."""

    def __init__(
        self,
        coord: Coordination,
        store: ObjectStore,
        *,
        region: str,
        agent_id: str,
        endpoint: str,
        policy: Callable[[], CompiledPolicy | None],
        fence: FencedResource,
        lease_ttl_s: int,
        unacked: UnackedWrites | None = None,
        interval_s: float = 0.1,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self.coord = coord
        self.store = store
        self.region = region
        self.agent_id = agent_id
        self.endpoint = endpoint
        self._policy = policy
        self._fence = fence
        self._unacked = unacked
        self._ttl_s = lease_ttl_s
        self._interval_s = interval_s
        self._retry = (retry_initial_s, retry_max_s)
        self._keepalive: KeepAlive | None = None
        self._task: asyncio.Task[None] | None = None
        self._published: dict[str, HoldingRecord] = {}
        self._summaries: dict[str, Summary] = {}
        self._seen: tuple[int, int] | None = None  # (change_seq, policy revision) summarised
        self.writes = 0  # etcd puts and deletes made (for tests: batching)
        self.pause_s = 0.0  # the pace set by the last summary's cost (PACE_FACTOR)

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="agent-holdings")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is None:
            return
        await keepalive.stop()
        try:
            await self.coord.revoke(keepalive.lease.id)
        except MeridianError as exc:
            log.warning("holdings_revoke_failed", error=str(exc), action="they expire with it")

    async def publish_now(self) -> None:
        """One pass (what the loop does each interval)."""
        if self._keepalive is None or self._keepalive.lost.is_set():
            if self._keepalive is not None:
                log.warning("holdings_lease_lost", action="publishing again on a new lease")
                await self._keepalive.stop()
            self._keepalive = None
            lease = await self.coord.grant(self._ttl_s)
            self._keepalive = self.coord.keep_alive(lease)
            self._published.clear()  # they went with the old lease
        policy = self._policy()
        seen = (await asyncio.to_thread(self.store.change_seq), policy.revision if policy else -1)
        if seen != self._seen:
            self._summaries, took = await asyncio.to_thread(self._summarise_all, policy)
            self._seen = seen
            self.pause_s = min(PACE_MAX_S, PACE_FACTOR * took)
        await self._write(self._keepalive.lease.id)

    def _summarise_all(self, policy: CompiledPolicy | None) -> tuple[dict[str, Summary], float]:
        """The summaries, and the CPU seconds this thread took for them."""
        started = time.thread_time()
        return self._summaries_of(policy), time.thread_time() - started

    def _summaries_of(self, policy: CompiledPolicy | None) -> dict[str, Summary]:
        if policy is None:
            return {}
        out: dict[str, Summary] = {}
        for dataset in self.store.dataset_names():
            placement = policy.placement(dataset)
            if placement is None or placement.dataset_class != "critical":
                continue
            if self.region not in placement.regions:
                continue
            out[dataset] = summarise(self.store, dataset)
        return out

    async def _write(self, lease_id: int) -> None:
        at = rfc3339(utcnow()) or ""
        for dataset, (objects, newest, digest, heads) in sorted(self._summaries.items()):
            unacked = [] if self._unacked is None else self._unacked.still_newest(dataset, heads)
            rec = HoldingRecord(
                dataset=dataset,
                region=self.region,
                agent=self.agent_id,
                endpoint=self.endpoint,
                objects=objects,
                newest=newest,
                digest=digest,
                epoch=self._fence.highest_epoch(dataset),
                at=at,
                unacked=tuple(unacked),
            )
            old = self._published.get(dataset)
            if old is not None and old.same_holding(rec):
                continue
            await self.coord.put(
                holding_key(dataset, self.region, self.agent_id), rec.value(), lease=lease_id
            )
            self._published[dataset] = rec
            self.writes += 1
        for dataset in sorted(set(self._published) - set(self._summaries)):
            await self.coord.delete(holding_key(dataset, self.region, self.agent_id))
            del self._published[dataset]
            self.writes += 1

    async def _run(self) -> None:
        delay = self._retry[0]
        while True:
            try:
                await self.publish_now()
                delay = self._retry[0]
                await asyncio.sleep(max(self._interval_s, self.pause_s))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd or the store away: retry
                log.warning("holdings_publish_retry", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])
