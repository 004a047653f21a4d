"""`AgentCatchUpProbe`: a switchover's catch-up wait asks the agents, not only the catalog.

Before a critical dataset moves to `region`, the target must hold every version the
owner acked. The catalog learns of copies through the agents' recorders, later than
the copies exist and possibly not at all while the catalog is down; the agents' own
listings are the truth. So this probe lists the dataset on an agent of the owner
region and on one of the target (their etcd registrations, routed through
`Settings.agent_address`), and reports every object whose newest version the target
lacks by HLC and digest (tombstones included), as `key@hlc`; then what the catalog
probe (`fallback`) still reports, so that neither source is dropped.

`incomplete_versions` is synchronous (the runbooks call it on a thread): each call
runs its own short event loop with its own etcd connection and channels. When etcd
or an agent cannot answer it reports the dataset as not caught up (a sentinel
entry naming why): the wait goes on rather than moving on a guess. When the owner
region has no agent registered at all (no data plane there: a control-plane-only
deployment, the controllers' own tests) only the catalog decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents.client import AgentClient, ObjectInfo
from agents.replication.peers import EtcdPeers, NoAgentError
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.catalog_glue.sources import CatchUpProbe
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import MeridianError
from controlplane.logs import get_logger

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
        if self._fallback is not None:
            missing += [
                m for m in self._fallback.incomplete_versions(dataset, region) if m not in missing
            ]
        return missing

    async def _compare(self, dataset: str, region: str) -> list[str]:
        coord = EtcdCoordination(self._etcd, timeout_s=self._timeout_s)
        await coord.connect()
        try:
            owner = await Ownership(coord).get(dataset)
            if owner is None or owner.region == region:
                return []
            peers = EtcdPeers(coord, self._route)
            try:
                owner_agent = await peers.address(owner.region)
            except NoAgentError:
                # No data plane in the owner region (a control-plane-only deployment):
                # nothing to compare, the catalog decides.
                return []
            source = await _listing(owner_agent, dataset)
            target = await _listing(await peers.address(region), dataset)
        finally:
            await coord.close()
        return lacking(source, target)


async def _listing(address: str, dataset: str) -> list[ObjectInfo]:
    async with AgentClient(address) as client:
        return await client.list(dataset, include_deleted=True)


def lacking(source: list[ObjectInfo], target: list[ObjectInfo]) -> list[str]:
    """`key@hlc` of each object whose newest version in `source` the target does not
    hold (its newest is older, or the same HLC with another digest)."""
    held = {o.key: o.version for o in target}
    out: list[str] = []
    for obj in source:
        have = held.get(obj.key)
        if (
            have is None
            or have.hlc < obj.version.hlc
            or (have.hlc == obj.version.hlc and have.digest != obj.version.digest)
        ):
            out.append(f"{obj.key}@{obj.version.hlc}")
    return out
