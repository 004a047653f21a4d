"""What `meridian region show REGION` prints: a region's agents from their registrations
in etcd (endpoint, weight, usage, liveness, placement state, how far behind their
records in the catalog are), its departed agents (`alive: false`, with departure
records on: their roster entries), and the rebalance in
progress, summed over the agents that report one, and their read caches, summed
likewise (spec/cli.md, *JSON shapes*)."""

from __future__ import annotations

import json

from agents.daemon.registration import records_behind
from agents.placement import departures
from agents.placement.members import LEAVING, Member, copies_for
from controlplane.coordination.protocols import keys
from controlplane.errors import NotFoundError
from controlplane.policy.current import PolicyView
from controlplane.ports.coordination import Coordination


async def region_report(
    coord: Coordination, region: str, configured_r: int | None = None
) -> dict[str, object]:
    """The `region show` document; NotFoundError for a region neither in the applied
    topology nor with any agent registered."""
    kvs, _ = await coord.get_prefix(keys.agents_of(region))
    members = [m for m in (Member.from_registration(kv.value) for kv in kvs) if m is not None]
    # By the registration keys too: one that does not parse is no departure.
    registered = {kv.key.rsplit("/", 1)[-1] for kv in kvs} | {m.agent_id for m in members}
    gone = await _departed(coord, region, registered)
    if not members and not gone:
        async with PolicyView(coord) as view:
            policy = view.current
        if policy is None or region not in policy.regions:
            known = ", ".join(sorted(policy.regions)) if policy else ""
            raise NotFoundError(
                f"region {region!r} is not in the applied topology and has no agent "
                f"registered (regions: {known or 'none; apply a policy first'})"
            )
    serving = [m for m in members if m.state != LEAVING]
    moving = [m for m in members if m.rebalance_objects or m.rebalance_bytes]
    rebalance = (
        {
            "remaining_bytes": sum(m.rebalance_bytes for m in moving),
            "remaining_objects": sum(m.rebalance_objects for m in moving),
        }
        if moving
        else None
    )
    behind = {r.agent_id: r.seconds for r in records_behind([kv.value for kv in kvs])}
    return {
        "name": region,
        "copies": copies_for(len(serving), configured_r) if serving else 0,
        "agents": [
            {
                "id": m.agent_id,
                "endpoint": m.endpoint,
                "weight": m.weight,
                "objects": m.objects,
                "bytes": m.bytes_stored,
                "alive": True,  # registered: its lease lives
                "state": m.state,
                # How far behind its records in the catalog are (None: not published).
                "records_behind_s": behind.get(m.agent_id),
            }
            for m in sorted(members, key=lambda m: m.agent_id)
        ]
        + gone,
        "rebalance": rebalance,
        "cache": _cache([kv.value for kv in kvs]),
    }


async def _departed(
    coord: Coordination, region: str, registered: set[str]
) -> list[dict[str, object]]:
    """The region's departed agents (departures.py: a durable roster entry and no
    registration: SIGKILLed, its host lost, its lease lapsed), listed `alive: false`
    with where they served. Only with departure records on; none otherwise."""
    prefix = departures.roster_of(region)
    kvs, _ = await coord.get_prefix(prefix)
    entries = departures.entries_from({kv.key.removeprefix(prefix): kv.value for kv in kvs})
    return [
        {
            "id": agent_id,
            "endpoint": entries[agent_id].endpoint,
            "weight": 0,
            "objects": 0,
            "bytes": 0,
            "alive": False,
            "state": "departed",
            "records_behind_s": None,
        }
        for agent_id in departures.departed(entries, registered)
    ]


def _cache(values: list[bytes]) -> dict[str, object] | None:
    """The read caches of the region's agents, summed (None: no agent has one): bytes
    held, the bound, and hits over reads."""
    held = limit = hits = reads = 0
    found = False
    for value in values:
        try:
            doc = json.loads(value)
        except ValueError:
            continue
        cache = doc.get("cache") if isinstance(doc, dict) else None
        if not isinstance(cache, dict):
            continue
        found = True
        held += _count(cache.get("bytes"))
        limit += _count(cache.get("limit_bytes"))
        hits += _count(cache.get("hits"))
        reads += _count(cache.get("hits")) + _count(cache.get("misses"))
    if not found:
        return None
    return {"bytes": held, "limit_bytes": limit, "hit_rate": hits / reads if reads else 0.0}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
