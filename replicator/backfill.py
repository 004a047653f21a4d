"""Policy changes take effect live: a dataset that gains this region as a replica is
backfilled at once.

The change log only carries writes made after the event; objects written before
this region was a replica never come through it. So the daemon follows the policy
view, and when a new revision places a standard dataset in this region that the
previous one did not, it runs the resync of that dataset (resync.py: the catalog's
newest version of every object the region lacks, fetched from its holders by the
agent, by LWW). A region removed, or a residency narrowed, needs nothing here: the
residency guard reads the current snapshot at every event, so no further copy is
made there.

What was backfilled is kept beside the replicator's journal (`state_path`): the
datasets placed here whose backfill finished. So a revision that placed a dataset
here while the replicator was down is backfilled at its next start, and a backfill
that failed (the catalog or the holders away) is retried, backing off to
`retry_max_s`, until it finishes, rather than left to an operator's resync. The
first start without that state takes the datasets placed here then as done (the
change log, read from its start by a new consumer group, carries their writes).

A write the applier skips (or refuses) here is one this region lacks: `forget` takes
its dataset out of what was backfilled, saved before the skip is reported done (so
before its offset is committed). Without it, a dataset dropped from this region and
placed again between two looks of the loop (a revision coalesced, a long backfill
of another dataset, a restart) stayed "done", and the writes skipped meanwhile were
never copied here.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

from agents.errors import ResidencyError
from controlplane.catalog.records import Placement
from controlplane.controller.duty import Backoff
from controlplane.errors import OperationTimeoutError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy, PolicyView
from replicator.ports import AgentPort
from replicator.resync import AgentsOf, ResyncCatalog, drive_resync, plan_resync

log = get_logger("meridian.replicator.backfill")

IDLE_WAIT_S = 3600.0  # how long a wait for a new revision lasts before it is renewed


def _changed_from(seen: CompiledPolicy | None) -> Callable[[CompiledPolicy | None], bool]:
    def changed(p: CompiledPolicy | None) -> bool:
        return p is not None and p is not seen

    return changed


class Backfill(Lifecycle):
    def __init__(
        self,
        view: PolicyView,
        catalog: ResyncCatalog,
        agent: AgentPort,
        agents_of: AgentsOf,
        region: str,
        *,
        state_path: Path | None = None,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
    ) -> None:
        self._view = view
        self._catalog = catalog
        self._agent = agent
        self._agents_of = agents_of
        self._region = region
        self._state_path = state_path
        self._backoff = Backoff(retry_initial_s, retry_max_s)
        self._task: asyncio.Task[None] | None = None
        self._done: set[str] = set()
        self._forgot = asyncio.Event()  # a dataset was forgotten since the loop last looked
        self._saving = asyncio.Lock()  # one save at a time, of the newest state
        # Forgotten while not done (a backfill of it may be running): not marked done by
        # that run, whose catalog read may predate the skipped write. Cleared each look.
        self._dirty: set[str] = set()
        self.runs = 0  # backfills that finished
        self.ran = asyncio.Event()  # set after each backfill, failed or not

    async def _do_start(self) -> None:
        # The snapshot at start, taken now: a revision published before the task first
        # runs is then still a change. The state is loaded before start returns, so a
        # `forget` from the applier finds it.
        seen = self._view.current
        done = await asyncio.to_thread(self._load)
        if done is None:
            done = set(_placed_here(seen, self._region))
            self._done = done
            await self._save_now()
        self._done = done
        self._task = asyncio.create_task(self._run(seen), name="replicator-backfill")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def forget(self, dataset: str) -> None:
        """A write of `dataset` was not copied here (skipped or refused under the policy
        then): placed here again, it is backfilled. Returns once that is saved."""
        if dataset not in self._done:
            self._dirty.add(dataset)
            return
        self._done.discard(dataset)
        log.info("backfill_forgotten", region=self._region, dataset=dataset)
        await self._save_now()
        self._forgot.set()

    async def _save_now(self) -> None:
        """Save the state as it stands once no other save runs (saves share one file:
        two at once could land the older last, or interleave)."""
        async with self._saving:
            await asyncio.to_thread(self._save, set(self._done))

    async def _wait(self, seen: CompiledPolicy | None, wait_s: float) -> None:
        """Until a new revision, or a dataset was forgotten; `OperationTimeoutError`
        after `wait_s`."""
        if self._forgot.is_set():
            return
        changed = asyncio.ensure_future(self._view.wait_for(_changed_from(seen), wait_s))
        forgot = asyncio.ensure_future(self._forgot.wait())
        try:
            await asyncio.wait({changed, forgot}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(*[t for t in (changed, forgot) if not t.done()])
        if changed.done() and not changed.cancelled():
            failed = changed.exception()  # retrieved either way (no "never retrieved")
            if failed is not None and not forgot.done():
                raise failed  # its timeout, if that is how it ended

    async def _run(self, seen: CompiledPolicy | None) -> None:
        """`self._done` holds the datasets placed here whose backfill finished (loaded at
        start; without a state, those `seen` places here are taken as done)."""
        wait_s: float | None = None  # None: look now (at start: placed while down?)
        while True:
            if wait_s is not None:
                try:
                    await self._wait(seen, wait_s)
                except OperationTimeoutError:
                    if wait_s == IDLE_WAIT_S:
                        continue  # an hour without a new revision: wait again
            wait_s = IDLE_WAIT_S
            self._forgot.clear()
            self._dirty.clear()
            current = self._view.current
            if current is None:
                continue
            seen = current
            here = _placed_here(current, self._region)
            # A dataset no longer placed here is forgotten: placed again, it is backfilled.
            self._done &= set(here)
            wanted = [p for name, p in sorted(here.items()) if name not in self._done]
            if wanted and not await self.backfill(current, wanted):
                wait_s = self._backoff.next()
                log.info("backfill_retry", region=self._region, retry_in_s=wait_s)
                continue
            self._backoff.reset()
            dirty = {p.dataset for p in wanted} & self._dirty
            self._done |= {p.dataset for p in wanted} - dirty
            await self._save_now()
            if dirty:
                self._forgot.set()  # skipped while backfilled: once more

    async def backfill(self, policy: CompiledPolicy, placements: list[Placement]) -> bool:
        """Backfill these datasets here; whether it finished (failed versions count as
        finished: each is recorded `failed`, and `replication resync` re-drives it)."""
        try:
            return await self._backfill(policy, placements)
        finally:
            self.ran.set()

    async def _backfill(self, policy: CompiledPolicy, placements: list[Placement]) -> bool:
        names = [p.dataset for p in placements]
        try:
            items = await asyncio.to_thread(plan_resync, self._catalog, placements, self._region)
            log.info("backfill_started", region=self._region, datasets=names, versions=len(items))
            results = await drive_resync(
                items,
                region=self._region,
                agent=self._agent,
                records=self._catalog,
                policy=policy,
                agents_of=self._agents_of,
            )
        except Exception as exc:  # noqa: BLE001 - retried; the daemon goes on
            log.warning(
                "backfill_failed",
                region=self._region,
                datasets=names,
                error=str(exc),
                action="retried until it finishes (or `meridian replication resync` now)",
            )
            return False
        failed = [r for r in results if r.outcome == "failed"]
        refused = [r for r in failed if (r.error or "").startswith(ResidencyError.__name__)]
        if refused:
            # The agent refused what the policy places here (its view lags the revision):
            # not done, retried with backoff until its view has it. Counted finished,
            # the writes its refusals skipped meanwhile were never copied.
            log.warning(
                "backfill_refused_by_agent",
                region=self._region,
                datasets=names,
                refused=len(refused),
                error=refused[0].error,
                action="retried until the agent's policy view places the dataset here",
            )
            return False
        self.runs += 1
        log.info(
            "backfill_done",
            region=self._region,
            datasets=names,
            versions=len(results),
            failed=len(failed),
        )
        return True

    # -- the state kept between runs --------------------------------------------------------
    def _load(self) -> set[str] | None:
        path = self._state_path
        if path is None or not path.exists():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            names = doc["done"]
            if doc.get("region") != self._region or not isinstance(names, list):
                raise ValueError(f"not the backfill state of region {self._region}")
            return {str(n) for n in names}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Unreadable: started afresh (as without state), said once.
            log.warning("backfill_state_unreadable", path=str(path), error=str(exc))
            return None

    def _save(self, done: set[str]) -> None:
        path = self._state_path
        if path is None:
            return
        doc = {"region": self._region, "done": sorted(done)}
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("w", encoding="utf-8") as fh:
                json.dump(doc, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            # Not fatal: the next start may backfill again (idempotent) or miss what
            # this run did not keep; the operator is told.
            log.warning("backfill_state_not_saved", path=str(path), error=str(exc))


def _placed_here(policy: CompiledPolicy | None, region: str) -> dict[str, Placement]:
    """The standard datasets `policy` places in `region`, by name."""
    if policy is None:
        return {}
    return {
        name: p
        for name, p in policy.placements.items()
        if p.dataset_class == "standard" and region in p.regions
    }
