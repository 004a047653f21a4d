"""The etcd side of departures (agents/placement/departures.py): an agent's own roster
entry, and the region's entries read fresh for a `complete` listing or a settled clear."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from agents.placement import departures
from agents.placement.departures import RosterEntry
from agents.placement.members import Members
from controlplane.coordination.protocols import keys
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.logs import get_logger
from controlplane.ports.coordination import Cmp, Compare, Coordination, Delete, Target

log = get_logger("meridian.agent.roster")


class Roster:
    """This agent's roster entry in `region`, and the region's departed agents. Its own
    entry's writes are serialised: a lowering and a settled raise that race must not
    leave the raise last on a count the region no longer has."""

    def __init__(
        self,
        coord: Coordination,
        region: str,
        agent_id: str,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.coord = coord
        self.region = region
        self.agent_id = agent_id
        self.key = departures.roster_key(region, agent_id)
        self._entry: RosterEntry | None = None
        self._writing = asyncio.Lock()
        # This agent took a version set while running: its entry stays at 1 copy. A
        # settled pass that looked at the store just before the set landed must not
        # raise it again (CI saw one do so, queued behind the lowering).
        self._holds_sets = False
        self._gauge = (
            Gauge(
                "meridian_agent_departed_agents",
                "Agents of the region with a roster entry and no registration "
                "(a complete listing is refused while there is one)",
                ["region"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    async def write(self, copies: int, endpoint: str) -> None:
        """Write (or rewrite, as a returning agent) this agent's entry: before it
        registers, so an agent that serves always has one. A returning agent's entry
        keeps the smaller of its old count and `copies`: what it holds was placed under
        the old one, and a restart places nothing."""
        async with self._writing:
            found = await self.coord.get(self.key)
            n = max(1, copies)
            if found is not None:
                # An unreadable entry reads as 1 copy, as departures.entries_from reads it.
                old = RosterEntry.parse(found.value)
                n = min(old.copies if old is not None else 1, n)
            entry = RosterEntry(self.agent_id, n, endpoint, rfc3339(utcnow()) or "")
            await self.coord.put(self.key, entry.value())
            self._entry = entry
        log.info("roster_written", key=self.key, copies=entry.copies)

    async def restore(self) -> None:
        """Rewrite this agent's entry as it stands: once registered (again), since a
        survivor's clear may have deleted it while this agent had no registration (in
        the gap before it registered, or after its lease was lost). Registered, no
        clear can delete it (each delete requires the agent to be unregistered)."""
        async with self._writing:
            entry = self._entry
            if entry is None:
                return
            await self.coord.put(self.key, entry.value())
        log.info("roster_restored", key=self.key, copies=entry.copies)

    async def see_copies(self, r: int) -> None:
        """Lower this agent's entry to `r` when it sees fewer copies than it vouched for."""
        async with self._writing:
            entry = self._entry
            new = None if entry is None else departures.lowered(entry, r)
            if new is None:
                return
            await self.coord.put(self.key, new.value())
            self._entry = new
        log.info("roster_copies_lowered", key=self.key, copies=new.copies)

    async def holding_sets(self) -> None:
        """Before a set (or a member) is stored here: the entry vouches for 1 copy, and
        no settled pass raises it again while this agent runs (a set's members stay on
        the agent that took it)."""
        self._holds_sets = True
        await self.see_copies(1)

    async def settled_at(self, r: int, now_r: Callable[[], int]) -> None:
        """After this agent's rebalance settled under `r` copies: everything it holds is
        at its `r` owners, so its entry vouches for `r` (raised from a count it saw
        while the region was smaller, or lowered). Never above `now_r()`, the count the
        region has as this writes: the pass ran on a snapshot that may be gone, and a
        lowering seen since must stand."""
        async with self._writing:
            entry = self._entry
            r = 1 if self._holds_sets else min(r, now_r())
            if entry is None or entry.copies == r or r < 1:
                return
            new = RosterEntry(entry.agent_id, r, entry.endpoint, entry.written_at)
            await self.coord.put(self.key, new.value())
            self._entry = new
        log.info("roster_copies_settled", key=self.key, copies=r)

    async def remove(self) -> None:
        """Delete this agent's entry: only after a drain that handed everything over."""
        async with self._writing:
            await self.coord.delete(self.key)
            self._entry = None
        log.info("roster_removed", key=self.key)

    async def entries(self) -> dict[str, tuple[RosterEntry, int]]:
        """The region's entries (with each key's mod revision), by agent id."""
        prefix = departures.roster_of(self.region)
        kvs, _ = await self.coord.get_prefix(prefix)
        values = {kv.key.removeprefix(prefix): kv.value for kv in kvs}
        revisions = {kv.key.removeprefix(prefix): kv.mod_revision for kv in kvs}
        parsed = departures.entries_from(values)
        return {a: (e, revisions[a]) for a, e in parsed.items()}

    async def departed(self, members: Members) -> list[str]:
        """The region's departed agents, from a fresh read of the roster and the
        registrations `members` holds (the watch's snapshot)."""
        found = await self.entries()
        gone = departures.departed(found, members.all)
        if self._gauge is not None:
            self._gauge.labels(region=self.region).set(len(gone))
        return gone

    async def clear_settled(self, members: Members) -> departures.ClearDecision:
        """After this agent's rebalance settled under `members`: delete the departed
        entries when departures.may_clear allows it. Each delete holds only if the entry
        is as read and its agent is still unregistered (it may be coming back)."""
        found = await self.entries()
        serving = tuple(sorted(m.agent_id for m in members.serving))
        settled = {a: m.settled == serving for a, m in members.all.items()}
        # This agent's own pass just settled under `members`; its published marker may
        # not have come back through the watch yet.
        settled[self.agent_id] = True
        decision = departures.may_clear({a: e for a, (e, _) in found.items()}, members.all, settled)
        if self._gauge is not None:
            self._gauge.labels(region=self.region).set(len(departures.departed(found, members.all)))
        if not decision.clear:
            if departures.departed(found, members.all):
                log.info("roster_kept", region=self.region, reason=decision.reason)
            return decision
        for agent_id in decision.clear:
            key = departures.roster_key(self.region, agent_id)
            result = await self.coord.txn(
                [
                    Compare(key, Target.MOD, Cmp.EQUAL, found[agent_id][1]),
                    Compare(keys.agent(self.region, agent_id), Target.CREATE, Cmp.EQUAL, 0),
                ],
                [Delete(key)],
            )
            log.info(
                "roster_cleared",
                region=self.region,
                agent=agent_id,
                deleted=result.succeeded,
                reason=decision.reason,
            )
        return decision
