"""`meridian replication resync`: re-drive every copy a region lacks, from the catalog.

The plan: for each standard dataset placed in the region, the newest version of
every object whose replica there is missing (never attempted: written while the
region was down, or before it was a replica), `pending` or `failed`
(`Catalog.incomplete_versions`), with the regions that hold it completed (the
sources). Versions the region wrote itself are not in it (they are its own), but
for one whose copy there is `failed` (startup repair found its bytes lost): only a
fetch from a region that holds it brings it back.

Driving one item: a failed replica moves back to `pending` (so `replication status`
shows it under way), then the region's agent applies it by LWW (a tombstone
directly, a put fetched from its holders nearest first), and the replica is
recorded `completed`, or `failed` with the error. Each step is idempotent, so a
resync interrupted half-way is simply run again; one racing the replicator has
one effect per version (LWW in the agent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from controlplane.catalog.records import Placement, VersionRef
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.errors import MeridianError
from controlplane.policy.current import CompiledPolicy
from replicator.guard import order_sources
from replicator.ports import AgentPort, ApplyOutcome, ReplicaRecords, Source


class ResyncCatalog(ReplicaRecords, Protocol):
    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]: ...

    def dataset_locations(self, name: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ResyncItem:
    dataset: str
    key: str
    version: Version
    state: str  # "missing", "pending" or "failed" in the region
    holders: tuple[str, ...]  # regions holding it completed
    retain_deletes: bool = False  # the dataset's policy says `deletes: retain`


def plan_resync(
    catalog: ResyncCatalog, placements: Sequence[Placement], region: str
) -> list[ResyncItem]:
    items: list[ResyncItem] = []
    for p in placements:
        if p.dataset_class != "standard" or region not in p.regions:
            continue
        # A version made here is on its way to the catalog (its recorder ships it), not
        # lacking, unless its copy here is `failed`: startup repair found its bytes
        # lost, and only a fetch from another region brings them back.
        incomplete = [v for v in catalog.incomplete_versions(p.dataset, region) if v.hlc]
        if not incomplete:
            continue
        sizes: dict[tuple[str, str], int] = {}
        holders: dict[tuple[str, str], list[str]] = {}
        states: dict[tuple[str, str], str] = {}
        for row in catalog.dataset_locations(p.dataset):
            name = (row["object"], row["version"])
            sizes[name] = int(row["size"] or 0)
            if row["region"] is None:
                continue
            if row["state"] == "completed":
                holders.setdefault(name, []).append(row["region"])
            if row["region"] == region:
                states[name] = row["state"]
        wanted = [
            v
            for v in incomplete
            if not v.hlc.endswith(f"@{region}") or states.get((v.object, v.version)) == "failed"
        ]
        for v in wanted:
            name = (v.object, v.version)
            hlc = HLC.parse(v.hlc)
            version = (
                Version.delete(hlc)
                if v.op == "delete"
                else Version.put(hlc, sizes.get(name, 0), Digest.parse(v.digest))
            )
            items.append(
                ResyncItem(
                    dataset=p.dataset,
                    key=v.object,
                    version=version,
                    state=states.get(name, "missing"),
                    holders=tuple(holders.get(name, ())),
                    retain_deletes=p.deletes == "retain",
                )
            )
    return items


@dataclass(frozen=True)
class ResyncResult:
    item: ResyncItem
    outcome: str  # an ApplyOutcome value, or "failed"
    error: str | None = None


AgentsOf = Callable[[str], Awaitable[list[Source]]]


async def drive_resync(
    items: Sequence[ResyncItem],
    *,
    region: str,
    agent: AgentPort,
    records: ResyncCatalog,
    policy: CompiledPolicy,
    agents_of: AgentsOf,
    on_done: Callable[[ResyncResult], None] = lambda _r: None,
) -> list[ResyncResult]:
    results: list[ResyncResult] = []
    for item in items:
        result = await _drive_one(item, region, agent, records, policy, agents_of)
        results.append(result)
        on_done(result)
    return results


async def _drive_one(
    item: ResyncItem,
    region: str,
    agent: AgentPort,
    records: ResyncCatalog,
    policy: CompiledPolicy,
    agents_of: AgentsOf,
) -> ResyncResult:
    hlc = str(item.version.hlc)
    now = datetime.now(UTC)
    if item.state == "failed":
        await asyncio.to_thread(
            records.set_replica_state, item.dataset, item.key, hlc, region, "pending"
        )
    if item.version.is_tombstone and item.retain_deletes:
        # As the applier does: the delete is recorded as processed here, the copy stays.
        await asyncio.to_thread(
            records.set_replica_state,
            item.dataset,
            item.key,
            hlc,
            region,
            "completed",
            attempted_at=now,
        )
        return ResyncResult(item, "retained")
    try:
        if item.version.is_tombstone:
            event = _event(item, policy, None)
            result = await agent.delete(event)
        else:
            if not item.holders:
                # Nothing to fetch it from: said, and its replica's own error (such as
                # "bytes lost here") is left as it is rather than replaced by this one.
                return ResyncResult(
                    item, "failed", "no region holds it completed: nothing to fetch it from"
                )
            candidates: list[Source] = []
            for holder in item.holders:
                candidates.extend(await agents_of(holder))
            sources = order_sources(policy, region, candidates)
            if not sources:
                raise MeridianError(
                    f"no agent of a region holding it ({', '.join(item.holders) or 'none'}) "
                    "is registered in etcd"
                )
            result = await agent.fetch(_event(item, policy, sources[0].address), sources)
    except Exception as exc:  # noqa: BLE001 - each failure is recorded on its replica
        error = f"{type(exc).__name__}: {exc}"
        await asyncio.to_thread(_record_failed, records, item, region, error, now)
        return ResyncResult(item, "failed", error)
    if result.outcome.holds_version:
        await asyncio.to_thread(
            records.set_replica_state,
            item.dataset,
            item.key,
            hlc,
            region,
            "completed",
            digest=str(item.version.digest) if item.version.digest else None,
            attempted_at=now,
        )
    return ResyncResult(item, result.outcome.value)


def _record_failed(
    records: ResyncCatalog, item: ResyncItem, region: str, error: str, at: datetime
) -> None:
    # A missing replica's row may start failed; a pending one moves there.
    records.set_replica_state(
        item.dataset,
        item.key,
        str(item.version.hlc),
        region,
        "failed",
        error=error,
        attempted_at=at,
    )


def _event(item: ResyncItem, policy: CompiledPolicy, origin_agent: str | None) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"resync:{item.dataset}/{item.key}@{item.version.hlc}",
        dataset=item.dataset,
        key=item.key,
        version=item.version,
        origin_region=item.version.hlc.region,
        policy_revision=max(1, policy.revision),
        origin_agent=origin_agent,
    )


__all__ = ["ApplyOutcome", "ResyncItem", "ResyncResult", "drive_resync", "plan_resync"]
