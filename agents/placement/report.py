"""What `meridian region show REGION` prints: a region's agents from their registrations
in etcd (endpoint, weight, usage, liveness, placement state, how far behind their
records in the catalog are) and the rebalance in
progress, summed over the agents that report one, and their read caches, summed
likewise (spec/cli.md, *JSON shapes*)."""

from __future__ import annotations

import json

from agents.daemon.registration import records_behind
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
    if not members:
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
                "alive": True,  # listed while its lease lives
                "state": m.state,
                # How far behind its records in the catalog are (None: not published).
                "records_behind_s": behind.get(m.agent_id),
            }
            for m in sorted(members, key=lambda m: m.agent_id)
        ],
        "rebalance": rebalance,
        "cache": _cache([kv.value for kv in kvs]),
    }


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
