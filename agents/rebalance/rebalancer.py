"""`Rebalancer`: keeps what this agent holds on the right agents of its region.

A pass walks the store (`ObjectStore.held`, newest version of each object) and, for
each object, compares its owners under the membership the last pass settled on
(`before`) with the current one:

- owners unchanged and this agent among them: nothing to do (no call at all), so a
  join or a loss moves only the objects whose owners changed;
- for each owner that is new to the object: it pulls the version from this agent
  (`Fetch` naming this agent as the source: `Sync`, with a delta where it holds a
  basis; LWW makes a second pusher's call, or an older version, a no-op);
- if this agent is no longer an owner and every owner now holds this version or a
  newer one: the local copy is forgotten (`ObjectStore.hand_off`), never before,
  so a reader always finds the object on one of the agents it asks.

Passes run on every change of the serving set (a join, a `leaving` state, a lapsed
lease), and every `interval_s` for the objects this agent holds without owning them
(copies taken by a stand-in while an owner was unreachable, or applied by the
replicator to whichever agent it reached). Version-set members stay where they are
(a set commits on the agent holding all its members).

`drain()` (SIGTERM) publishes the `leaving` state, so peers stop choosing this
agent, and runs a pass that hands everything it holds to the remaining agents.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from agents.placement.members import LEAVING, SERVING, Members
from agents.placement.watch import MembershipWatch
from agents.rebalance.metrics import RebalanceMetrics
from agents.routing.copies import fetch_many_to
from agents.routing.peers import PeerStubs
from agents.store import ObjectStore, StoredVersion
from controlplane.domain.version import Version
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from meridian.v1 import agent_pb2

log = get_logger("meridian.agent.rebalance")

_HELD_OUTCOMES = (
    agent_pb2.APPLY_OUTCOME_APPLIED,
    agent_pb2.APPLY_OUTCOME_SAME,
    agent_pb2.APPLY_OUTCOME_OLDER,
)
_PAGE = 500
# Serving shapes remembered between settled passes (see `Rebalancer._seen`).
_HISTORY_MAX = 16
_DRAIN_PASSES = 5  # at most, within the drain's timeout
# Objects per FetchMany call of a pass.
_BATCH = 64


@dataclass
class Progress:
    """The pass in progress (zeros when none): what is left to move, and totals."""

    remaining_objects: int = 0
    remaining_bytes: int = 0
    moved_objects: int = 0
    moved_bytes: int = 0
    handed_off: int = 0
    running: bool = False

    def as_json(self) -> dict[str, object] | None:
        if not self.running:
            return None
        return {
            "remaining_bytes": self.remaining_bytes,
            "remaining_objects": self.remaining_objects,
        }


class Rebalancer(Lifecycle):
    """See the module docstring. `endpoint()` is where peers reach this agent;
    `publish()` rewrites the registration (the `leaving` state, the progress)."""

    def __init__(
        self,
        store: ObjectStore,
        members: MembershipWatch,
        peers: PeerStubs,
        agent_id: str,
        region: str,
        endpoint: Callable[[], str],
        *,
        publish: Callable[[], Awaitable[None]] | None = None,
        interval_s: float = 30.0,
        concurrency: int = 4,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.members = members
        self.peers = peers
        self.agent_id = agent_id
        self.region = region
        self.endpoint = endpoint
        self._publish = publish
        self.interval_s = interval_s
        self.concurrency = concurrency
        self.state = SERVING
        self.progress = Progress()
        self.passes = 0
        self._settled: Members | None = None  # the membership the last pass completed
        # Every serving shape seen since then (in order): an agent was a previous owner
        # of an object only if it owned it under each of them. Compared with the settled
        # one alone, a join then a quick loss (owners {a,b} -> {a,d} -> {a,b}) reads as
        # "unchanged" on `a`, while `b` handed its copy to `d` and dropped it.
        self._seen: list[Members] = []
        self._settled_reads = 0  # the watch's whole reads when the last pass settled
        # Called after a pass settled (nothing left to move) under a membership: the
        # roster's clear of departed agents (agents/placement/roster.py).
        self.on_settled: Callable[[Members], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self.metrics = RebalanceMetrics(registry, self._remaining) if registry is not None else None

    def _remaining(self) -> tuple[int, int]:
        p = self.progress
        return (p.remaining_objects, p.remaining_bytes) if p.running else (0, 0)

    def registration_fields(self) -> dict[str, object]:
        """The fields this agent adds to its registration."""
        settled = self._settled
        return {
            "state": self.state,
            "rebalance": self.progress.as_json(),
            # The serving ids the last settled pass ran under (departures.py).
            "settled": sorted(m.agent_id for m in settled.serving) if settled else [],
        }

    async def _do_start(self) -> None:
        self.members.on_change(self._on_change)
        self._kick.set()  # a first pass: what this store holds may belong elsewhere now
        self._task = asyncio.create_task(self._run(), name="rebalance")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def _on_change(self, current: Members) -> None:
        settled = self._settled
        last = self._seen[-1] if self._seen else settled
        if last is None or _shape(last) != _shape(current):
            if len(self._seen) <= _HISTORY_MAX:  # past it: "unknown", no need for more
                self._seen.append(current)
            self._kick.set()
        elif settled is None or _shape(settled) != _shape(current):
            self._kick.set()

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._kick.wait()
            except TimeoutError:
                if self._alone(self.members.current) and self._settled is not None:
                    continue  # a lone agent owns all it holds: no walk of its store
            self._kick.clear()
            try:
                await self.run_pass()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next change or interval retries
                log.warning("rebalance_pass_failed", error=str(exc))
                if self.metrics is not None:
                    self.metrics.passes.labels(outcome="failed").inc()
                await asyncio.sleep(1.0)
                self._kick.set()

    def _alone(self, members: Members) -> bool:
        return all(agent_id == self.agent_id for agent_id in members.all)

    async def drain(self, timeout_s: float) -> bool:
        """Leave the region: publish `leaving`, then hand everything held to the agents
        that stay (bounded by `timeout_s`). True when nothing is left here: no object
        not handed over, and no version set (those are not moved)."""
        if self._alone(self.members.current):
            return False  # a lone agent keeps its objects (and stops as before)
        self.state = LEAVING
        if self._publish is not None:
            try:
                await self._publish()
            except Exception as exc:  # noqa: BLE001 - etcd away: the lease lapses instead
                log.warning("drain_publish_failed", error=str(exc))
                return False
        deadline = time.monotonic() + timeout_s
        # The watch must show this agent leaving before the pass computes owners.
        for _ in range(100):
            member = self.members.current.get(self.agent_id)
            if member is None or member.state == LEAVING or time.monotonic() > deadline:
                break
            try:
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    await self.members.changed()
            except TimeoutError:
                break
        if not self.members.current.serving or all(
            m.agent_id == self.agent_id for m in self.members.current.serving
        ):
            log.warning("drain_alone", action="no other agent serves; its objects stay here")
            return False
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                # Again while some did not move: a copy refused or not sent (an owner that
                # began leaving too) goes to the owners the next pass computes.
                for _ in range(_DRAIN_PASSES):
                    left = await self.run_pass(leaving=True)
                    others = [
                        m for m in self.members.current.serving if m.agent_id != self.agent_id
                    ]
                    if left == 0 or not others:
                        break
        except TimeoutError:
            log.warning("drain_timed_out", timeout_s=timeout_s)
            return False
        # Version sets stay where they were taken: an agent that holds one has not
        # handed everything over, whatever the pass moved (a store that cannot say is
        # taken to hold one).
        try:
            sets_kept = await asyncio.to_thread(self.store.holds_sets)
        except Exception as exc:  # noqa: BLE001 - the stop goes on; the entry stays
            log.warning("drain_sets_unknown", error=str(exc))
            sets_kept = True
        log.info("drain_complete", left=left, sets_kept=sets_kept)
        if sets_kept:
            log.warning(
                "drain_kept_sets",
                action="this agent holds version sets, which are not moved: its copies "
                "are the region's only ones, so it leaves a departure behind",
            )
        return left == 0 and not sets_kept

    async def run_pass(self, *, leaving: bool = False) -> int:
        """One pass over the store (see the module docstring); returns how many objects
        this agent still holds without owning them."""
        async with self._lock:
            current = self.members.current
            me = current.get(self.agent_id)
            if me is None and not leaving:
                return 0  # not registered yet (or lost its lease): nothing is decided
            before = self._settled
            seen, reads = len(self._seen), self.members.reads
            # Owners before are taken as unknown (every owner is asked; one that holds
            # the object answers SAME) when there are too many shapes to intersect
            # cheaply, or the watch read the region whole since (a broken watch: the
            # shapes in between were not seen).
            unknown = seen > _HISTORY_MAX or (before is not None and reads != self._settled_reads)
            history = None if unknown else list(self._seen)
            work = await self._plan(None if history is None else before, current, history or [])
            self.progress = Progress(
                remaining_objects=len(work),
                remaining_bytes=sum(w.version.size for w in work),
                running=bool(work),
            )
            if work:
                log.info(
                    "rebalance_started",
                    objects=len(work),
                    bytes=self.progress.remaining_bytes,
                    serving=[m.agent_id for m in current.serving],
                )
                await self._publish_quietly()
            started = time.monotonic()
            stray = await self._move_all(work)
            self.passes += 1
            if self.metrics is not None:
                self.metrics.passes.labels(outcome="unfinished" if stray else "settled").inc()
                if work:
                    self.metrics.pass_seconds.observe(time.monotonic() - started)
            if work:
                log.info(
                    "rebalance_finished",
                    moved_objects=self.progress.moved_objects,
                    moved_bytes=self.progress.moved_bytes,
                    handed_off=self.progress.handed_off,
                    left=stray,
                )
            self.progress.running = False
            if stray == 0:
                self._settled, self._settled_reads = current, reads
                del self._seen[:seen]
            else:
                self._kick.set()  # something could not move: try again soon
            await self._publish_quietly()
        if stray == 0 and not leaving and self.on_settled is not None:
            try:
                await self.on_settled(current)
            except Exception as exc:  # noqa: BLE001 - the next settled pass tries again
                log.warning("rebalance_on_settled_failed", error=str(exc))
        return stray

    async def _publish_quietly(self) -> None:
        if self._publish is None:
            return
        try:
            await self._publish()
        except Exception as exc:  # noqa: BLE001 - progress is advisory
            log.warning("rebalance_publish_failed", error=str(exc))

    async def _plan(
        self, before: Members | None, current: Members, history: list[Members]
    ) -> list[_Move]:
        work: list[_Move] = []
        after: tuple[str, str] | None = None
        for _ in range(1_000_000):  # pages of the store; bounded by its size
            page = await asyncio.to_thread(self.store.held, after, _PAGE)
            for stored in page:
                move = self._decide(before, current, stored, history)
                if move is not None:
                    work.append(move)
            if len(page) < _PAGE:
                break
            after = (page[-1].dataset, page[-1].key)
        return work

    def _decide(
        self,
        before: Members | None,
        current: Members,
        stored: StoredVersion,
        history: list[Members],
    ) -> _Move | None:
        if stored.set_id is not None or stored.state != "present":
            return None
        owners = current.owner_ids(stored.dataset, stored.key)
        if not owners:
            return None
        mine = self.agent_id in owners and self.state != LEAVING
        previous = (
            set(before.owner_ids(stored.dataset, stored.key)) if before is not None else set()
        )
        for seen in history:
            if not previous:
                break
            previous &= set(seen.owner_ids(stored.dataset, stored.key))
        if mine and before is not None and set(owners) == previous:
            return None
        targets = [o for o in owners if o != self.agent_id and (not mine or o not in previous)]
        if not targets and mine:
            return None
        return _Move(stored, tuple(targets), owners, drop=not mine)

    async def _move_all(self, work: list[_Move]) -> int:
        """Push each object to its new owners, batched per target (`FetchMany`), then
        forget the copies this agent no longer owns once every owner holds them.
        Returns how many objects are not yet where they belong."""
        current = self.members.current
        by_target: dict[str, list[_Move]] = {}
        pending: dict[int, int] = {}
        for n, item in enumerate(work):
            wanted = [t for t in (item.owners if item.drop else item.targets) if t != self.agent_id]
            pending[n] = len(wanted)
            for target_id in wanted:
                by_target.setdefault(target_id, []).append(item)
        index = {id(item): n for n, item in enumerate(work)}
        failed: set[int] = set()
        gate = asyncio.Semaphore(self.concurrency)

        def done(item: _Move, ok: bool) -> None:
            n = index[id(item)]
            if not ok:
                failed.add(n)
                if self.metrics is not None:
                    self.metrics.copy_failures.inc()
            pending[n] -= 1
            if pending[n] == 0:
                self.progress.remaining_objects -= 1
                self.progress.remaining_bytes -= item.version.size

        async def batch(target_id: str, items: list[_Move]) -> None:
            target = current.get(target_id)
            if target is None or target.state == LEAVING:
                # A leaving agent may already have scanned its store for its drain: a
                # copy pushed there now leaves with it. The next pass plans again.
                for item in items:
                    done(item, False)
                return
            async with gate:
                try:
                    answer = await fetch_many_to(
                        self.peers,
                        target,
                        [(i.stored.dataset, i.stored.key, i.version) for i in items],
                        region=self.region,
                        source=self.endpoint(),
                    )
                except Exception as exc:  # noqa: BLE001 - retried at the next pass
                    log.warning("rebalance_copy_failed", to=target_id, error=str(exc))
                    for item in items:
                        done(item, False)
                    return
            for item, result, error in zip(items, answer.results, answer.errors, strict=False):
                held = not error and result.outcome in _HELD_OUTCOMES
                if held and result.outcome == agent_pb2.APPLY_OUTCOME_APPLIED:
                    self.progress.moved_objects += 1
                    self.progress.moved_bytes += item.version.size
                    if self.metrics is not None:
                        self.metrics.moved_objects.inc()
                        self.metrics.moved_bytes.inc(item.version.size)
                if error:
                    log.warning(
                        "rebalance_copy_failed",
                        dataset=item.stored.dataset,
                        key=item.stored.key,
                        to=target_id,
                        error=error,
                    )
                done(item, held)
            for item in items[len(answer.results) :]:
                done(item, False)

        await asyncio.gather(
            *(
                batch(target_id, items[i : i + _BATCH])
                for target_id, items in by_target.items()
                for i in range(0, len(items), _BATCH)
            )
        )
        for n, item in enumerate(work):
            if n in failed or not item.drop:
                continue
            if await asyncio.to_thread(
                self.store.hand_off, item.stored.dataset, item.stored.key, item.version.hlc
            ):
                self.progress.handed_off += 1
                if self.metrics is not None:
                    self.metrics.handed_off.inc()
        return len(failed)


@dataclass(frozen=True)
class _Move:
    stored: StoredVersion
    targets: tuple[str, ...]
    owners: tuple[str, ...]
    drop: bool

    @property
    def version(self) -> Version:
        return self.stored.version


def _shape(members: Members) -> tuple[int, tuple[tuple[str, int], ...]]:
    return members.r, tuple((m.agent_id, m.weight) for m in members.serving)
