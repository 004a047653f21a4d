"""`meridian dataset evict`: drop a region's copies of a dataset its placement no longer
names, once the regions that do name it are shown to hold each one.

`policy apply` refuses to narrow a residency while copies would be left outside it,
and a policy that drops a region from a placement leaves that region's copies where
they are (nothing pushes to it any more, nothing removes what it holds). A critical
copy left behind is also a hazard: once the placement's regions forget an expired
delete, a region later added back could hand a takeover the older put it still holds.

Refused while the region is in the placement (a copy region or a failover candidate)
or etcd names it the dataset's owner or a handover's target. The proof is made from
the agents, not the catalog (whose records ship behind them):

1. The region's complete listing (every agent, merged: its newest version of each
   object), and each placement region's complete listing of the LOWEST of its
   agents' newest versions; a placement region that cannot be listed whole stops
   the eviction.
2. An object goes when enough placement regions (the ack's count for a critical
   dataset, one for a standard one) hold its newest version here, or a newer one,
   readable (a copy whose bytes startup repair found gone does not count). A delete
   also counts as held by a region showing nothing of the object once it is older
   than the tombstone retention and no placement region shows an older version
   (what an expired delete leaves), unless the placement retains deletes. The
   retention and the clock are the placement's agents' (the longest and the earliest
   of their `Health` answers): they are the ones that forget deletes.
3. The region's newest complete version set is proven the same way (the same id,
   HLC and members, complete there); an object a set readers may see names goes
   only with its set proven (the agent checks).
4. Everything else stays, named with why. After confirmation the proof is made
   again, and every agent of the region is asked to forget what it proves
   (`Evict`, in pages, with the placement's digest). Each agent refuses the whole
   call on the same rules as above, as it sees them, and when its applied policy
   places the dataset otherwise (retriable: asked again a few times), and keeps, under
   the object's lock, an object written there since, one whose change event it has
   not yet published, and one a complete set names that is at least as new as both
   the agent's own newest complete set and the proven set (readers may see it),
   unless that set was proven. The partial bytes of its cut pulls of what it
   forgot go too (not a pull still running).
5. The region is listed again: whatever it still holds is reported (exit 3).

The agents journal each version `removed`, so the catalog (and `audit residency`)
forget the copies once their records ship. The read-through cache is not a copy and
is not touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agents.client import AgentClient, ObjectInfo
from agents.replication.peers import registered_endpoint
from agents.replication.sync import copies_needed
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.eviction import OwnerSeen, eviction_refused, placement_digest
from controlplane.domain.hlc import HLC
from controlplane.domain.placement import Placement
from controlplane.domain.version_set import VersionSet
from controlplane.errors import (
    InvalidInputError,
    MeridianError,
    NotFoundError,
    OperationTimeoutError,
    RefusedError,
    UnavailableError,
)
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Coordination
from meridian.v1 import agent_pb2

log = get_logger("meridian.evict")

# Keys per Evict call (the agent takes at most 1,000).
EVICT_PAGE = 500
# A page refused as retriable (an agent's policy lagging etcd) is asked again.
EVICT_ATTEMPTS = 5
EVICT_RETRY_S = 0.5
NOT_SHOWN = "proven only after confirmation, so not shown before: run it again"

Route = Callable[[str, str], str]
Progress = Callable[[str], None]
Listing = Mapping[str, ObjectInfo]


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
    kept: dict[str, str] = field(default_factory=dict)  # key -> why
    error: str | None = None


@dataclass
class Eviction:
    """What an eviction proved (`evictable`, `sets`), kept, and unless a dry run, did;
    `remaining`: what the region still held after it (listed again)."""

    dataset: str
    region: str
    evictable: list[tuple[str, HLC]]
    sets: list[tuple[str, str]]  # (id, HLC) of the version sets proven
    kept: list[Kept]
    dry_run: bool
    agents: list[AgentEviction] = field(default_factory=list)
    remaining: list[Kept] = field(default_factory=list)
    # Why the region could not be listed after the eviction (what stays is unknown).
    unlisted: str | None = None
    placement_digest: str = ""  # of the placement the agents were asked under

    @property
    def failed(self) -> bool:
        return self.unlisted is not None or any(a.error is not None for a in self.agents)

    def as_json(self) -> dict[str, object]:
        shown = self.kept if self.dry_run else self.remaining
        return {
            "dataset": self.dataset,
            "region": self.region,
            "dry_run": self.dry_run,
            "evictable": len(self.evictable),
            "sets": [f"{set_id}@{hlc}" for set_id, hlc in self.sets],
            "evicted": 0 if self.dry_run else len(self.evictable) - len(self.remaining_asked),
            "kept": [{"object": k.key, "version": k.version, "why": k.why} for k in shown],
            "agents": self.agent_rows(),
            "unlisted": self.unlisted,
        }

    @property
    def remaining_asked(self) -> list[Kept]:
        asked = {key for key, _ in self.evictable}
        return [k for k in self.remaining if k.key in asked]

    def agent_rows(self) -> list[dict[str, object]]:
        return [
            {
                "endpoint": a.endpoint,
                "objects": a.objects,
                "versions": a.versions,
                "bytes": a.bytes,
                "kept": len(a.kept),
                "error": a.error,
            }
            for a in self.agents
        ]


@dataclass(frozen=True)
class Proof:
    """What step 1's listings show: the region's own, and one per placement region."""

    here: Listing
    placement: list[Listing]
    need: int
    retention_ms: int | None  # the placement's agents' (None: unknown, nothing expired)
    retains_deletes: bool
    now_ms: int


def plan_eviction(proof: Proof) -> tuple[list[tuple[str, HLC]], list[Kept]]:
    """Of what the region holds, what may go (key, its newest HLC here) and what must
    stay, each with why (steps 1-2 of the module docstring)."""
    evictable: list[tuple[str, HLC]] = []
    kept: list[Kept] = []
    for key in sorted(proof.here):
        mine = proof.here[key].version
        held = 0
        collides = missing = False
        newest_there: list[str] = []
        older_shown = False
        for listing in proof.placement:
            theirs = listing.get(key)
            if theirs is None:
                continue
            newest_there.append(theirs.version.hlc.text)
            if theirs.version.hlc < mine.hlc:
                older_shown = True
            elif theirs.missing:
                missing = True
            elif theirs.version == mine:
                held += 1
            elif theirs.version.hlc > mine.hlc:
                # Where deletes are retained, a newer delete there is that region's own:
                # it never was, nor will be, sent this put.
                retained = proof.retains_deletes and theirs.version.is_tombstone
                held += 0 if retained and not mine.is_tombstone else 1
            else:
                collides = True
        if mine.is_tombstone and not older_shown and not proof.retains_deletes:
            retention = proof.retention_ms
            # Strictly older, as the agents' own expiry (ObjectStore.expire_tombstones).
            if retention is not None and proof.now_ms - mine.hlc.wall_ms > retention:
                held += sum(1 for listing in proof.placement if key not in listing)
        if held >= proof.need:
            evictable.append((key, mine.hlc))
            continue
        why = _why(mine.is_tombstone, collides, missing, held, proof, newest_there)
        kept.append(Kept(key, mine.hlc.text, why))
    return evictable, kept


def _why(
    tombstone: bool, collides: bool, missing: bool, held: int, proof: Proof, there: list[str]
) -> str:
    shown = f"{held} of the {proof.need} placement region(s) needed hold it"
    if collides:
        return f"{shown}; one holds other bytes at the same HLC"
    if missing:
        return f"{shown}; one holds it with its bytes lost (a resync restores them)"
    if not there:
        if tombstone:
            return (
                f"{shown}: a delete younger than the placement's tombstone retention "
                "(or not every agent of it could say it: an old agent, upgrade it; a "
                "proxy route or a stale registration), or retained"
            )
        return f"{shown}: no region of the placement holds it (its only copy)"
    return f"{shown} (their newest: {', '.join(sorted(set(there)))}): not replicated yet"


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
    """Prove (and unless `dry_run`, after `confirm`, carry out) the eviction of
    `dataset`'s copies from `region`; see the module docstring."""
    placement = await _placement(coord, dataset)
    # One definition of "the same placement" for the CLI and the agents: its digest.
    digest = placement_digest(placement)
    await _refuse(coord, placement, region)
    agents = await _agents(coord, route, region)
    plan = await _prove(coord, route, placement, region, agents, timeout_s)
    plan.dry_run = dry_run
    if dry_run:
        return plan
    if not plan.evictable or (confirm is not None and not await confirm(plan)):
        plan.remaining = list(plan.kept)  # nothing asked: all of it stays
        return plan
    # The operator may have taken a while: the policy must be the one shown, and the
    # proof is made again; only what both proofs (and the operator) allowed is asked.
    if placement_digest(await _placement(coord, dataset)) != digest:
        raise RefusedError(
            f"dataset {dataset}: the applied policy changed while the eviction was "
            "confirmed; nothing was dropped: run it again"
        )
    await _refuse(coord, placement, region)
    shown = {key for key, _ in plan.evictable}
    plan = await _prove(coord, route, placement, region, agents, timeout_s)
    plan.kept += [Kept(k, at.text, NOT_SHOWN) for k, at in plan.evictable if k not in shown]
    plan.evictable = [(k, at) for k, at in plan.evictable if k in shown]
    # Read again after the proof: a policy applied during it refuses the run (the
    # agents compare what they apply with this digest).
    if placement_digest(await _placement(coord, dataset)) != digest:
        raise RefusedError(
            f"dataset {dataset}: the applied policy changed during the proof; nothing "
            "was dropped: run it again"
        )
    plan.placement_digest = digest
    for endpoint in agents:
        plan.agents.append(await _evict_at(endpoint, plan, timeout_s, progress))
    try:
        after = await _listing(agents[0], dataset, timeout_s, lowest=False)
    except MeridianError as exc:
        # The agents acted already: say so, and what is known, rather than only this.
        plan.unlisted = f"the region could not be listed after the eviction: {exc}"
        after = {}
    why = {k.key: k.why for k in plan.kept}
    for a in plan.agents:
        why.update(a.kept)
    late = "still held after the eviction: re-copied meanwhile, or on an agent that failed"
    plan.remaining = [
        Kept(key, info.version.hlc.text, why.get(key, late)) for key, info in sorted(after.items())
    ]
    log.info(
        "dataset_evicted",
        dataset=dataset,
        region=region,
        evictable=len(plan.evictable),
        remaining=len(plan.remaining),
        failed=plan.failed,
    )
    return plan


async def _prove(
    coord: Coordination,
    route: Route,
    placement: Placement,
    region: str,
    agents: list[str],
    timeout_s: float,
) -> Eviction:
    dataset = placement.dataset
    here = await _listing(agents[0], dataset, timeout_s, lowest=False)
    # Each placement region's agents, read once for the whole proof.
    registered = {other: await _registrations(coord, other) for other in placement.regions}
    retention_ms: int | None = None
    # Before the placement's listings: a "now" no later than them (an absence they
    # show is judged by a clock read before it was seen).
    now_ms = int(time.time() * 1000)
    if placement.deletes != "retain" and any(o.version.is_tombstone for o in here.values()):
        retention_ms, now_ms = await _expiry_clock(route, placement, registered, timeout_s)
    theirs: dict[str, str] = {}
    listings: list[Listing] = []
    for other in placement.regions:
        if not registered[other]:
            raise UnavailableError(
                f"region {other} of the placement has no agent registered in etcd: nothing "
                "can be shown held there"
            )
        # Any one agent: a complete listing merges every agent of its region.
        address = theirs[other] = route(other, min(e for _, e in registered[other]))
        try:
            listings.append(await _listing(address, dataset, timeout_s, lowest=True))
        except MeridianError as exc:
            raise UnavailableError(
                f"region {other} of {dataset}'s placement cannot be listed whole ({exc}): "
                f"nothing {region} holds can be shown held there; try again once it answers"
            ) from exc
    need = copies_needed(placement) if placement.dataset_class == "critical" else 1
    proof = Proof(here, listings, need, retention_ms, placement.deletes == "retain", now_ms)
    evictable, kept = plan_eviction(proof)
    sets = await _proven_sets(agents[0], list(theirs.values()), dataset, need, timeout_s)
    return Eviction(dataset, region, evictable, sets, kept, dry_run=False)


async def _expiry_clock(
    route: Route,
    placement: Placement,
    registered: Mapping[str, Sequence[tuple[str, str]]],
    timeout_s: float,
) -> tuple[int | None, int]:
    """The tombstone retention and the time an expired delete is judged by, as the
    placement's agents (the ones that forget deletes) keep them: the longest retention
    of all and the earliest clock of all, this host's included. The retention is None
    (no delete counts as expired) when an agent predates saying it, or when the route
    map sends the calls meant for one agent to another (a proxy): not every agent
    could be asked. `registered`: (agent id, endpoint) of each agent, by region."""
    longest = 0
    earliest = int(time.time() * 1000)
    for other in placement.regions:
        agents = registered.get(other, ())
        if not agents:  # nobody to say it (a retention of 0 would expire all)
            return None, earliest
        for agent_id, endpoint in agents:
            address = route(other, endpoint)
            try:
                async with AgentClient(address, timeout_s=timeout_s) as client:
                    health = await client.health()
            except MeridianError as exc:
                raise UnavailableError(
                    f"an agent of region {other} ({address}) of {placement.dataset}'s "
                    f"placement cannot say how long it keeps deletes ({exc}); try again "
                    "once it answers"
                ) from exc
            if health.agent_id != agent_id:
                log.warning("evict_expiry_unknown", region=other, agent=agent_id, asked=address)
                return None, earliest
            if health.tombstone_retention_ms is None or health.now_ms is None:
                log.warning("evict_expiry_unknown", region=other, agent=agent_id, old=True)
                return None, earliest
            longest = max(longest, health.tombstone_retention_ms)
            earliest = min(earliest, health.now_ms)
    return longest, earliest


async def _proven_sets(
    here: str, there: Sequence[str], dataset: str, need: int, timeout_s: float
) -> list[tuple[str, str]]:
    """The region's newest complete version set, when `need` placement regions show it
    complete with the same HLC and members (else nothing: its members stay)."""
    mine = await _set_at(here, dataset, "latest", timeout_s)
    if mine is None:
        return []
    shown = 0
    for address in there:
        theirs = await _set_at(address, dataset, mine.id, timeout_s)
        if theirs is not None and theirs.hlc == mine.hlc and theirs.members == mine.members:
            shown += 1
    return [(mine.id, str(mine.hlc))] if shown >= need else []


async def _set_at(address: str, dataset: str, set_id: str, timeout_s: float) -> VersionSet | None:
    async with AgentClient(address, timeout_s=timeout_s) as client:
        try:
            return await client.get_set(dataset, set_id)
        except NotFoundError:
            return None
        except MeridianError:
            return None  # not shown complete there (members missing, an agent away)


async def _evict_at(
    endpoint: str, plan: Eviction, timeout_s: float, progress: Progress | None
) -> AgentEviction:
    out = AgentEviction(endpoint)
    try:
        async with AgentClient(endpoint, timeout_s=timeout_s) as client:
            for at in range(0, len(plan.evictable), EVICT_PAGE):
                page = plan.evictable[at : at + EVICT_PAGE]
                answer = await _evict_page(client, plan, page)
                out.objects += answer.objects
                out.versions += answer.versions
                out.bytes += answer.bytes
                out.kept.update((k.key, k.why) for k in answer.kept)
                if progress is not None:
                    asked = min(at + EVICT_PAGE, len(plan.evictable))
                    progress(
                        f"{endpoint}: {asked}/{len(plan.evictable)} objects asked, "
                        f"{out.objects} forgotten"
                    )
    except MeridianError as exc:
        # The other agents are still asked; the listing after says what stays.
        out.error = str(exc)
        log.warning("evict_agent_failed", endpoint=endpoint, error=str(exc))
    return out


async def _evict_page(
    client: AgentClient, plan: Eviction, page: list[tuple[str, HLC]]
) -> agent_pb2.EvictResponse:
    """One page asked of one agent, again (at most EVICT_ATTEMPTS times, bounded in
    time) while it refuses as retriable: an agent whose policy watch lags etcd by a
    moment refuses a proof made under the placement it has not seen yet. Only
    `UnavailableError` is asked again, not a timeout (whose call may still run there,
    and would run up to EVICT_ATTEMPTS times the timeout). Asking again
    is safe: what went is skipped, what stays is judged afresh."""
    for attempt in range(1, EVICT_ATTEMPTS + 1):
        try:
            return await client.evict(
                plan.dataset, page, plan.sets, placement_digest=plan.placement_digest
            )
        except MeridianError as exc:
            lagging = isinstance(exc, UnavailableError) and not isinstance(
                exc, OperationTimeoutError
            )
            if not lagging or attempt == EVICT_ATTEMPTS:
                raise
            await asyncio.sleep(EVICT_RETRY_S * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _placement(coord: Coordination, dataset: str) -> Placement:
    """The dataset's placement under the applied policy."""
    kv = await coord.get(keys.POLICY_CURRENT)
    if kv is None:
        raise InvalidInputError("no policy is applied: `meridian policy apply` first")
    policy = CompiledPolicy.from_json(kv.value, etcd_revision=kv.mod_revision)
    placement = policy.placement(dataset)
    if placement is None:
        raise InvalidInputError(
            f"dataset {dataset}: no rule of the applied policy places it, so no region can "
            "be shown to hold its copies"
        )
    return placement


async def _refuse(coord: Coordination, placement: Placement, region: str) -> None:
    found = await Ownership(coord).get(placement.dataset)
    owner = None if found is None else OwnerSeen(found.region, found.epoch, found.handing_over_to)
    why = eviction_refused(placement, region, owner)
    if why is not None:
        raise RefusedError(why)


async def _agents(coord: Coordination, route: Route, region: str) -> list[str]:
    """Where to call each agent of `region`. A route map that names one address for
    several agents (a proxy) would send every call to one of them: refused."""
    registered = await _registered(coord, region)
    if not registered:
        raise UnavailableError(f"region {region} has no agent registered in etcd")
    routed = sorted({route(region, endpoint) for endpoint in registered})
    if len(routed) < len(registered):
        raise RefusedError(
            f"region {region}: the agent route map names one address for its "
            f"{len(registered)} agents, and each must be asked; call them directly "
            "(unset MERIDIAN_AGENT_ROUTES for this region)"
        )
    return routed


async def _registered(coord: Coordination, region: str) -> list[str]:
    return sorted(endpoint for _, endpoint in await _registrations(coord, region))


async def _registrations(coord: Coordination, region: str) -> list[tuple[str, str]]:
    """(agent id, endpoint) of each agent registered in `region`."""
    prefix = keys.agents_of(region)
    kvs, _ = await coord.get_prefix(prefix)
    out = []
    for kv in kvs:
        endpoint = registered_endpoint(kv.value)
        if endpoint is not None:
            out.append((kv.key.removeprefix(prefix), endpoint))
    return sorted(out)


async def _listing(address: str, dataset: str, timeout_s: float, *, lowest: bool) -> Listing:
    """A region's complete listing, tombstones included: every agent's newest version
    of each object merged by the highest, or with `lowest` the lowest."""
    async with AgentClient(address, timeout_s=timeout_s) as client:
        found = await client.list(dataset, include_deleted=True, complete=True, lowest=lowest)
    return {o.key: o for o in found}
