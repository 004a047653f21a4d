"""`meridian dataset evict`: drop a region's copies of a dataset its placement no longer
names, once the regions that do name it are shown to hold each one.

`policy apply` refuses to narrow a residency while copies would be left outside it,
and a policy that drops a region from a placement leaves that region's copies where
they are (nothing pushes to it any more, nothing removes what it holds). A critical
copy left behind is also a hazard: once the placement's regions forget an expired
delete, a region later added back could hand a takeover the older put it still holds.

The proof is made from the agents, not the catalog (whose records ship behind them):
1. The region's listing (every agent, merged: the newest version of each object) and
   the listings of the placement's regions (their newest of each, merged).
2. An object goes when a placement region holds its newest version here or a newer
   one, or when that version is a delete no placement region shows anything of (what
   a delete leaves). It stays when it is newer here than anywhere in the placement
   (written here, or not replicated yet: its only copy) or collides at the same HLC
   with other bytes; each kept object is named with why.
3. Every agent of the region is asked to forget those objects (`Evict`, in pages).
   Each agent checks again, under the object's lock, that it holds nothing newer than
   the version proven, and refuses the whole call while the applied policy still
   places the dataset in its region: a policy applied meanwhile wins.

The agents journal each version `removed`, so the catalog (and `audit residency`)
forget the copies once their records ship.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from agents.client import AgentClient, ObjectInfo
from controlplane.coordination.orchestration.prefer import union_newest
from controlplane.coordination.protocols import keys
from controlplane.domain.hlc import HLC
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import InvalidInputError, MeridianError, RefusedError, UnavailableError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Coordination

log = get_logger("meridian.evict")

# Keys per Evict call (the agent takes at most 1,000).
EVICT_PAGE = 500

Route = Callable[[str, str], str]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Kept:
    key: str
    version: str
    why: str


@dataclass
class AgentEviction:
    endpoint: str
    objects: int = 0
    versions: int = 0
    bytes: int = 0
    kept: list[str] = field(default_factory=list)


@dataclass
class Eviction:
    """What an eviction found (`evictable`, `kept`) and, unless a dry run, did."""

    dataset: str
    region: str
    evictable: list[tuple[str, HLC]]
    kept: list[Kept]
    agents: list[AgentEviction]
    unlisted: dict[str, str]  # placement region -> why its listing was not read
    dry_run: bool

    @property
    def remaining(self) -> list[Kept]:
        """What the region still holds after it: kept by the plan or by an agent."""
        planned = {k.key for k in self.kept}
        late = sorted({key for a in self.agents for key in a.kept} - planned)
        newer = "written in this region after its listing (newer than the version proven)"
        return [*self.kept, *(Kept(key, "", newer) for key in late)]

    def as_json(self) -> dict[str, object]:
        return {
            "dataset": self.dataset,
            "region": self.region,
            "dry_run": self.dry_run,
            "evictable": len(self.evictable),
            "evicted": sum(a.objects for a in self.agents),
            "versions": sum(a.versions for a in self.agents),
            "bytes": sum(a.bytes for a in self.agents),
            "kept": [{"object": k.key, "version": k.version, "why": k.why} for k in self.remaining],
            "agents": self.agent_rows(),
            "unlisted": self.unlisted,
        }

    def agent_rows(self) -> list[dict[str, object]]:
        return [
            {
                "endpoint": a.endpoint,
                "objects": a.objects,
                "versions": a.versions,
                "bytes": a.bytes,
                "kept": len(a.kept),
            }
            for a in self.agents
        ]


def plan_eviction(
    here: Mapping[str, Version], elsewhere: Mapping[str, Version]
) -> tuple[list[tuple[str, HLC]], list[Kept]]:
    """Of what the region holds (`here`: its newest version of each object), what may go
    (key, the HLC to state) and what must stay, given the placement's regions' newest
    (`elsewhere`). See the module docstring."""
    evictable: list[tuple[str, HLC]] = []
    kept: list[Kept] = []
    for key in sorted(here):
        mine, theirs = here[key], elsewhere.get(key)
        if theirs is None:
            if mine.is_tombstone:
                evictable.append((key, mine.hlc))
            else:
                why = "no region of the placement holds it: this is its only copy"
                kept.append(Kept(key, mine.hlc.text, why))
        elif theirs.hlc > mine.hlc or theirs == mine:
            evictable.append((key, mine.hlc))
        elif theirs.hlc == mine.hlc:
            why = f"the placement holds other bytes at the same HLC ({theirs.digest})"
            kept.append(Kept(key, mine.hlc.text, why))
        else:
            why = (
                f"newer here than in any region of the placement (their newest is "
                f"{theirs.hlc.text}): written here, or not replicated yet"
            )
            kept.append(Kept(key, mine.hlc.text, why))
    return evictable, kept


async def evict_dataset(
    coord: Coordination,
    route: Route,
    dataset: str,
    region: str,
    *,
    dry_run: bool,
    confirm: Callable[[Eviction], Awaitable[bool]] | None = None,
    progress: Progress | None = None,
    timeout_s: float = 60.0,
) -> Eviction:
    """Plan (and unless `dry_run`, after `confirm`, carry out) the eviction of `dataset`'s
    copies from `region`. Refused when the applied policy still places the dataset
    there; UnavailableError when the region has no agent registered."""
    placement = await _placement(coord, dataset)
    if region in (*placement.regions, *placement.failover_order):
        raise RefusedError(
            f"dataset {dataset}: the applied policy (policy {placement.policy}) still places "
            f"it in {region}; apply a policy without {region} first, then evict"
        )
    agents = await _endpoints(coord, route, region)
    if not agents:
        raise UnavailableError(f"region {region} has no agent registered in etcd")
    here = await _newest(agents[0], dataset, timeout_s)
    listings: list[dict[str, Version]] = []
    unlisted: dict[str, str] = {}
    for other in placement.regions:
        try:
            found = await _endpoints(coord, route, other)
            if not found:
                raise UnavailableError(f"region {other} has no agent registered in etcd")
            listings.append(await _newest(found[0], dataset, timeout_s))
        except MeridianError as exc:
            unlisted[other] = str(exc)
            log.warning("evict_region_unlisted", dataset=dataset, region=other, error=str(exc))
    if not listings:
        raise UnavailableError(
            f"no region of {dataset}'s placement could be listed, so nothing {region} holds "
            "can be shown held elsewhere: "
            + "; ".join(f"{r}: {why}" for r, why in sorted(unlisted.items()))
        )
    evictable, kept = plan_eviction(here, union_newest(listings))
    done = Eviction(dataset, region, evictable, kept, [], unlisted, dry_run)
    if dry_run or not evictable or (confirm is not None and not await confirm(done)):
        return done
    for endpoint in agents:
        done.agents.append(await _evict_at(endpoint, dataset, evictable, timeout_s, progress))
    log.info(
        "dataset_evicted",
        dataset=dataset,
        region=region,
        objects=sum(a.objects for a in done.agents),
        kept=len(done.remaining),
    )
    return done


async def _evict_at(
    endpoint: str,
    dataset: str,
    evictable: list[tuple[str, HLC]],
    timeout_s: float,
    progress: Progress | None,
) -> AgentEviction:
    out = AgentEviction(endpoint)
    async with AgentClient(endpoint, timeout_s=timeout_s) as client:
        for at in range(0, len(evictable), EVICT_PAGE):
            page = evictable[at : at + EVICT_PAGE]
            answer = await client.evict(dataset, page)
            out.objects += answer.objects
            out.versions += answer.versions
            out.bytes += answer.bytes
            out.kept.extend(answer.kept)
            if progress is not None:
                progress(
                    f"{endpoint}: {min(at + EVICT_PAGE, len(evictable))}/{len(evictable)} "
                    f"objects asked, {out.objects} forgotten"
                )
    return out


async def _placement(coord: Coordination, dataset: str) -> Placement:
    kv = await coord.get(keys.POLICY_CURRENT)
    if kv is None:
        raise InvalidInputError("no policy is applied: `meridian policy apply` first")
    placement = CompiledPolicy.from_json(kv.value, etcd_revision=kv.mod_revision).placement(dataset)
    if placement is None:
        raise InvalidInputError(
            f"dataset {dataset}: no rule of the applied policy places it, so no region can "
            "be shown to hold its copies"
        )
    return placement


async def _endpoints(coord: Coordination, route: Route, region: str) -> list[str]:
    kvs, _ = await coord.get_prefix(keys.agents_of(region))
    out: list[str] = []
    for kv in kvs:
        try:
            doc = json.loads(kv.value)
        except ValueError:
            continue
        endpoint = doc.get("endpoint") if isinstance(doc, dict) else None
        if isinstance(endpoint, str) and endpoint:
            out.append(route(region, endpoint))
    return sorted(out)


async def _newest(address: str, dataset: str, timeout_s: float) -> dict[str, Version]:
    """The region's newest version of each object, tombstones included (a routed
    listing: every agent of the region, merged)."""
    async with AgentClient(address, timeout_s=timeout_s) as client:
        found: list[ObjectInfo] = await client.list(dataset, include_deleted=True)
    return {o.key: o.version for o in found}
