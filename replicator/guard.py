"""The residency guard and the fetch-source order: pure decisions on one policy snapshot.

`admit(event, policy, region)` says what a region does with a change event before
any byte moves (dataplane.md, *Residency*; checked again by the agent itself):

- `OWN`: the region wrote it (its own outbox published it): nothing to do;
- `NOT_GOVERNED`: no applied policy places the dataset: no copy (fail closed);
- `NOT_FOR_US`: the placement does not name this region: no copy;
- `REFUSED`: the placement names this region but its jurisdiction is outside the
  dataset's residency: no copy, and the refusal is recorded and dead-lettered;
- `ADMIT`: copy it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane.domain.events import ChangeEvent, LogEvent
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy
from replicator.ports import Source


class Admission(enum.Enum):
    OWN = "own"
    NOT_GOVERNED = "not governed"
    NOT_FOR_US = "not for us"
    REFUSED = "residency"
    ADMIT = "admit"


@dataclass(frozen=True)
class Decision:
    admission: Admission
    placement: Placement | None
    reason: str


def admit(event: LogEvent, policy: CompiledPolicy, region: str) -> Decision:
    """The decision for a change of one object or a version set (by its dataset alone)."""
    if event.origin_region == region:
        return Decision(Admission.OWN, None, f"written in {region}")
    placement = policy.placement(event.dataset)
    if placement is None:
        return Decision(
            Admission.NOT_GOVERNED,
            None,
            f"no policy of revision {policy.revision} places dataset {event.dataset}",
        )
    if region not in placement.regions:
        return Decision(
            Admission.NOT_FOR_US,
            placement,
            f"{event.dataset} lives in {', '.join(placement.regions)}, not {region}",
        )
    jurisdiction = policy.regions.get(region)
    if jurisdiction is None or jurisdiction not in placement.residency:
        return Decision(
            Admission.REFUSED,
            placement,
            f"{region} (jurisdiction {jurisdiction or 'unknown'}) is outside the residency "
            f"of {event.dataset} ({', '.join(placement.residency)})",
        )
    return Decision(Admission.ADMIT, placement, "admitted")


def order_sources(
    policy: CompiledPolicy, region: str, candidates: Iterable[Source]
) -> list[Source]:
    """Holders nearest first by link RTT (unknown RTTs last, then by name); one per
    address, never this region itself."""
    unique: dict[str, Source] = {}
    for source in candidates:
        if source.region != region and source.address:
            unique.setdefault(source.address, source)
    by_region: dict[str, list[Source]] = {}
    for source in unique.values():
        by_region.setdefault(source.region, []).append(source)
    ordered: list[Source] = []
    for name in policy.nearest(region, by_region):
        ordered.extend(by_region[name])
    return ordered


def sources_for(
    event: ChangeEvent, policy: CompiledPolicy, region: str, holders: Sequence[Source]
) -> list[Source]:
    """Where to fetch an event's version from: its origin agent and any other known
    holders, nearest first."""
    origin = (
        [Source(event.origin_region, event.origin_agent)] if event.origin_agent is not None else []
    )
    return order_sources(policy, region, [*origin, *holders])
