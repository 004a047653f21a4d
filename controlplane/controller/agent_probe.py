"""`AgentCatchUpProbe`: a switchover's catch-up wait asks the agents, not only the catalog.

Before a critical dataset moves to `region`, the target must hold every version the
owner acked. The catalog learns of copies through the agents' recorders, later than
the copies exist and possibly not at all while the catalog is down; the agents' own
listings are the truth. So this probe lists the dataset on an agent of every region
of its placement (their etcd registrations, routed through `Settings.agent_address`)
and reports, as `key@hlc`, every object whose possibly-acked newest version the
target lacks by HLC and digest (tombstones included).

*Possibly acked* (`required`): a write is acked once `copies_needed` regions hold
it, and during the handover every replica but the target refuses the pushes it
checks (the target takes the owner's, agents/admission.py `_through_handover`),
so one acked meanwhile is on the target or on a replica that checked before the
mark. So per object, the newest version that at least `copies_needed` regions
hold (at or above: a newer version supersedes it by LWW) is what the target must
hold. A version only the owner holds (committed just as the freeze began, its
pushes refused, its client told "not acked, retry") is not waited for: it may
never reach the target, and waiting for it aborted every switchover under load
(found by the critical fault tests); should the target take it after this
listing, the two hold it and that ack is on the target. When some
region of the placement cannot be listed, it may hold acked versions nobody else
shows, so the target must then hold everything the owner holds (the strict rule).

`incomplete_versions` is synchronous (the runbooks call it on a thread): each call
runs its own short event loop with its own etcd connection and channels. When etcd
or the owner's or the target's agent cannot answer it reports the dataset as not
caught up (a sentinel entry naming why): the wait goes on rather than moving on a
guess; so does an owner region whose agents are all gone (none registered, while
its roster entries stand or the target has agents: the owner's last acked versions
may be in no catalog yet; the operator's way out is a failover). The catalog
(`fallback`) decides only when there is no data plane at all (no agent of the owner
region registered or on its roster, none of the target: a control-plane-only
deployment, the controllers' own tests); when the agents answered they decide alone,
since the catalog also lists the owner's unacked versions and lags behind the copies.
A listing of a region of several agents must be complete, and a copy whose bytes are
found missing there is not held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from agents.client import AgentClient, ObjectInfo
from agents.placement.departures import roster_of
from agents.replication.peers import EtcdPeers, NoAgentError
from agents.replication.sync import copies_needed
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.catalog_glue.sources import CatchUpProbe
from controlplane.coordination.orchestration.prefer import forgotten_deletes
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.placement import Placement
from controlplane.errors import MeridianError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy

log = get_logger("meridian.controller.catchup")

Route = Callable[[str, str], str]


class AgentCatchUpProbe:
    def __init__(
        self,
        etcd_endpoints: list[str],
        route: Route,
        fallback: CatchUpProbe | None = None,
        *,
        etcd_timeout_s: float = 5.0,
    ) -> None:
        self._etcd = etcd_endpoints
        self._route = route
        self._fallback = fallback
        self._timeout_s = etcd_timeout_s

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        try:
            missing = asyncio.run(self._compare(dataset, region))
        except MeridianError as exc:
            log.warning("catchup_probe_unanswered", dataset=dataset, region=region, error=str(exc))
            missing = [f"(agents of {dataset} cannot be compared: {exc})"]
        if missing is None:  # no data plane in the owner region: the catalog decides
            return (
                []
                if self._fallback is None
                else self._fallback.incomplete_versions(dataset, region)
            )
        return missing

    async def _compare(self, dataset: str, region: str) -> list[str] | None:
        coord = EtcdCoordination(self._etcd, timeout_s=self._timeout_s)
        await coord.connect()
        try:
            owner = await Ownership(coord).get(dataset)
            if owner is None:
                return []
            if owner.region == region:
                # Asked after the move (a failover's RPO exposure for the journal): the
                # target cannot be compared with itself as owner; the catalog decides.
                return None
            peers = EtcdPeers(coord, self._route)
            try:
                owner_agent = await peers.address(owner.region)
            except NoAgentError:
                rostered, _ = await coord.get_prefix(roster_of(owner.region))
                if not rostered and not await _has_agents(peers, region):
                    # No data plane at all (a control-plane-only deployment): nothing to
                    # compare, the catalog decides.
                    return None
                # The owner's agents are gone (stopped, or their leases expired; their
                # roster entries may stand) while there is a data plane: the owner's
                # acked versions cannot be listed, and the catalog, fed by the
                # recorders, may lack the last of them. (A critical dataset owned by a
                # region that never had an agent took no write: a failover moves it.)
                return [
                    f"(owner region {owner.region} has no agent registered: "
                    "its versions cannot be compared; a failover --force moves it)"
                ]
            source = await _listing(owner_agent, dataset)
            target = await _listing(await peers.address(region), dataset)
            placement = await _placement(coord, dataset)
            others: list[list[ObjectInfo]] = []
            complete = placement is not None
            for other in placement.regions if placement is not None else ():
                if other in (owner.region, region):
                    continue
                try:
                    others.append(await _listing(await peers.address(other), dataset))
                except MeridianError as exc:
                    log.info("catchup_probe_region_unlisted", region=other, error=str(exc))
                    complete = False
        finally:
            await coord.close()
        if not complete or placement is None:
            return lacking(source, target)
        return lacking_required([source, target, *others], target, copies_needed(placement))


async def _has_agents(peers: EtcdPeers, region: str) -> bool:
    try:
        await peers.address(region)
    except NoAgentError:
        return False
    return True


async def _listing(address: str, dataset: str) -> list[ObjectInfo]:
    # complete: in a region of several agents, one that does not answer fails the
    # listing rather than hide the versions it holds (an acked one among them).
    async with AgentClient(address) as client:
        return await client.list(dataset, include_deleted=True, complete=True)


async def _placement(coord: EtcdCoordination, dataset: str) -> Placement | None:
    kv = await coord.get(keys.POLICY_CURRENT)
    if kv is None:
        return None
    return CompiledPolicy.from_json(kv.value, etcd_revision=kv.mod_revision).placement(dataset)


def required(listings: list[list[ObjectInfo]], need: int) -> list[ObjectInfo]:
    """Per object, the newest version that at least `need` of the regions' `listings`
    hold at or above (their own newest is that one or newer): what an ack at `need`
    copies may have covered. Objects no `need` regions hold are left out."""
    by_key: dict[str, list[ObjectInfo]] = {}
    for listing in listings:
        for obj in listing:
            by_key.setdefault(obj.key, []).append(obj)
    out: list[ObjectInfo] = []
    for key in sorted(by_key):
        held = sorted(by_key[key], key=lambda o: o.version.hlc, reverse=True)
        if len(held) >= need:
            out.append(held[need - 1])
    return out


def lacking_required(
    every: list[list[ObjectInfo]], target: list[ObjectInfo], need: int
) -> list[str]:
    """What `target` lacks of the versions an ack at `need` copies may have covered,
    judged over `every` region's listing (the target's included). A required delete
    the target has nothing of is not lacking when no listing shows an older version
    of its key (it forgot the expired delete): judged against the required version,
    not the newest anywhere, so a lone newer write on one region does not make the
    target wait for a push that delete does not need."""
    wanted = required(every, need)
    shown = [{o.key: o.version for o in listing} for listing in every]
    forgotten = forgotten_deletes({o.key: o.version for o in wanted}, shown)
    return lacking(wanted, target, forgotten)


def lacking(
    source: list[ObjectInfo], target: list[ObjectInfo], forgotten: Collection[str] = ()
) -> list[str]:
    """`key@hlc` of each object whose newest version in `source` the target does not
    hold (its newest is older, or the same HLC with another digest); a key of
    `forgotten` (a delete no region shows anything older of: prefer.forgotten_deletes)
    the target has nothing of is not lacking."""
    # A copy whose bytes startup repair found gone is not held.
    held = {o.key: o.version for o in target if not o.missing}
    out: list[str] = []
    for obj in source:
        have = held.get(obj.key)
        if have is None and obj.key in forgotten:
            continue
        if (
            have is None
            or have.hlc < obj.version.hlc
            or (have.hlc == obj.version.hlc and have.digest != obj.version.digest)
        ):
            out.append(f"{obj.key}@{obj.version.hlc}")
    return out
