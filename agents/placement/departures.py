"""Departed agents: the rules that keep a takeover proof from reading "held nowhere"
off a region that lost the holders (issue 13).

Every agent writes a durable roster entry `/meridian/roster/<region>/<agent-id>` (no
lease) before it registers, and deletes it only after a SIGTERM drain that handed
everything over. An entry that stands without a registration names an agent that
*departed*: SIGKILLed, its host lost, its lease lapsed. What it held may be held nowhere
else, so while any agent of the region has departed a `complete` listing is refused
(retriable): the proof decides nothing, its pass retries.

An entry is cleared by its agent coming back (it rewrites it as it starts), or by a
settled rebalance when the loss is provably covered: fewer agents departed than the
smallest `copies` (the replica count `r`) any departed entry vouched for, and every
registered agent settled under the current membership. Otherwise an operator restarts
the agents or accepts the loss (`etcdctl del /meridian/roster/<region>/<id>`,
agents/placement/README.md).

Pure functions only; the etcd I/O is agents/placement/roster.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agents.placement.members import json_object

ROSTER = "/meridian/roster/"


def roster_of(region: str) -> str:
    """The prefix of a region's roster entries."""
    return f"{ROSTER}{region}/"


def roster_key(region: str, agent_id: str) -> str:
    return f"{ROSTER}{region}/{agent_id}"


@dataclass(frozen=True, slots=True)
class RosterEntry:
    """One agent's durable roster entry: the copies `r` it placed under (the smallest it
    saw since it wrote the entry), where it served, and when the entry was written."""

    agent_id: str
    copies: int
    endpoint: str
    written_at: str

    def value(self) -> bytes:
        doc = {
            "id": self.agent_id,
            "copies": self.copies,
            "endpoint": self.endpoint,
            "written_at": self.written_at,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def parse(cls, value: bytes) -> RosterEntry | None:
        """The entry `value` names; None for a value that is not one. An unreadable entry
        is not skipped by the callers: it counts as departed with copies 1 (see
        `entries_from`), since dropping it would let a proof through."""
        doc = json_object(value)
        if doc is None:
            return None
        agent_id, copies = doc.get("id"), doc.get("copies")
        if not isinstance(agent_id, str) or not agent_id:
            return None
        if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
            return None
        return cls(
            agent_id=agent_id,
            copies=copies,
            endpoint=str(doc.get("endpoint") or ""),
            written_at=str(doc.get("written_at") or ""),
        )


def entries_from(values: Mapping[str, bytes]) -> dict[str, RosterEntry]:
    """Roster entries by agent id (the key's last part). A value that does not parse is
    kept as an entry vouching for 1 copy: the most cautious reading of a broken entry."""
    found: dict[str, RosterEntry] = {}
    for agent_id, value in values.items():
        entry = RosterEntry.parse(value)
        found[agent_id] = entry or RosterEntry(agent_id, 1, "", "")
    return found


def departed(roster: Iterable[str], registered: Iterable[str]) -> list[str]:
    """The agents with a roster entry and no registration, sorted."""
    live = set(registered)
    return sorted(a for a in set(roster) if a not in live)


def lowered(entry: RosterEntry, r: int) -> RosterEntry | None:
    """The entry to write when its agent now sees `r` copies: lowered to a smaller `r`
    (never raised: what it placed under the smaller count may have only that many copies),
    None when it stands as is."""
    if r < 1 or r >= entry.copies:
        return None
    return RosterEntry(entry.agent_id, r, entry.endpoint, entry.written_at)


@dataclass(frozen=True, slots=True)
class ClearDecision:
    """Whether the departed entries may go now, and why (for the log)."""

    clear: tuple[str, ...]
    reason: str


def may_clear(
    roster: Mapping[str, RosterEntry],
    registered: Iterable[str],
    settled: Mapping[str, bool],
) -> ClearDecision:
    """The departed entries a settled rebalance may delete.

    All of them, when fewer agents departed than the smallest `copies` a departed entry
    vouched for (each object then has a copy on a survivor) and every registered agent
    (`settled`: agent id -> it settled under the current membership) has settled (the
    survivors re-replicated, so the copies are back to `r`). None otherwise."""
    live = list(registered)
    gone = departed(roster, live)
    if not gone:
        return ClearDecision((), "no agent departed")
    if not live:
        return ClearDecision((), "no agent is registered")
    unsettled = sorted(a for a in live if not settled.get(a, False))
    if unsettled:
        return ClearDecision((), f"not settled under the current membership: {unsettled}")
    smallest = min(roster[a].copies for a in gone)
    if len(gone) >= smallest:
        return ClearDecision(
            (),
            f"{len(gone)} agents departed and an entry vouched for {smallest} copies: "
            "an object may have had every copy on them",
        )
    return ClearDecision(tuple(gone), f"{len(gone)} departed < {smallest} copies")


def refusal(region: str, gone: Iterable[str]) -> str:
    """The message of a refused `complete` listing."""
    names = ", ".join(sorted(gone))
    return (
        f"the listing of {region} cannot be complete: agents departed without handing "
        f"over (roster entry, no registration): {names}; restart them, or accept the "
        f"loss with `etcdctl del {ROSTER}{region}/<id>`"
    )
