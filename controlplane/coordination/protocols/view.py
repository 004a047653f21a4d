"""An immutable snapshot of the coordination state, read in one transaction.

Decisions (failover, runbooks, the controller's reconcile) are taken on a
`ClusterView` and then applied by transactions that re-check the revisions they
relied on, so a decision taken on a stale view fails instead of doing harm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import (
    Owner,
    decode_owners,
    handing_over,
)
from controlplane.coordination.timeutil import rfc3339, utcnow
from controlplane.ports.coordination import (
    Cmp,
    Compare,
    Coordination,
    Get,
    KeyValue,
    Put,
    Target,
)


class RegionState(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    FENCED = "fenced"


@dataclass(frozen=True, slots=True)
class ClusterView:
    revision: int
    alive: dict[str, KeyValue]
    states: dict[str, RegionState]
    state_revisions: dict[str, int]
    maintenance: bool
    owners: dict[str, Owner]

    def is_alive(self, region: str) -> bool:
        return region in self.alive

    def state_of(self, region: str) -> RegionState:
        return self.states.get(region, RegionState.ACTIVE)

    def owned_by(self, region: str) -> list[str]:
        return sorted(d for d, o in self.owners.items() if o.region == region)


async def read_view(coord: Coordination) -> ClusterView:
    res = await coord.txn(
        [],
        [
            Get(keys.REGIONS, prefix=True),
            Get(keys.OWNERS, prefix=True),
            Get(keys.HANDOVER, prefix=True),
            Get(keys.MAINTENANCE),
        ],
    )
    region_kvs, owner_kvs, handover_kvs, maint = res.reads
    alive: dict[str, KeyValue] = {}
    states: dict[str, RegionState] = {}
    state_revs: dict[str, int] = {}
    for kv in region_kvs:
        parsed = keys.region_of(kv.key)
        if parsed is None:
            continue
        region, what = parsed
        if what == "alive":
            alive[region] = kv
        elif what == "state":
            try:
                states[region] = RegionState(kv.value.decode())
            except ValueError:
                states[region] = RegionState.FENCED  # unreadable: safest is "do not use"
            state_revs[region] = kv.mod_revision
    marks = handing_over(handover_kvs)
    owners = decode_owners(owner_kvs, marks)
    return ClusterView(res.revision, alive, states, state_revs, bool(maint), owners)


async def set_region_state(coord: Coordination, region: str, state: RegionState) -> int:
    if state is RegionState.ACTIVE:
        await coord.delete(keys.state(region))
        return await coord.revision()
    return await coord.put(keys.state(region), state.value.encode())


@dataclass(frozen=True, slots=True)
class Maintenance:
    """Who paused automatic failover, when and why (the `maintenance` key's value)."""

    reason: str
    actor: str
    since: str

    def describe(self) -> str:
        return f"since {self.since} by {self.actor} ({self.reason})"


def _maintenance(value: bytes) -> Maintenance:
    try:
        doc = json.loads(value)
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    return Maintenance(
        str(doc.get("reason", "?")), str(doc.get("actor", "?")), str(doc.get("since", "?"))
    )


async def set_maintenance(
    coord: Coordination, on: bool, *, reason: str, actor: str
) -> Maintenance | None:
    """Pause (`on`) or resume automatic failover.

    Pausing writes the key only if it is absent, in one transaction, so a second
    `pause` never overwrites the first one's reason, actor and time: it returns that
    first pause (None when this call paused).
    """
    if not on:
        await coord.delete(keys.MAINTENANCE)
        return None
    doc = {"reason": reason, "actor": actor, "since": rfc3339(utcnow())}
    res = await coord.txn(
        [Compare(keys.MAINTENANCE, Target.CREATE, Cmp.EQUAL, 0)],
        [Put(keys.MAINTENANCE, json.dumps(doc).encode())],
        [Get(keys.MAINTENANCE)],
    )
    if res.succeeded:
        return None
    [existing] = res.reads
    return _maintenance(existing[0].value) if existing else Maintenance("?", "?", "?")
