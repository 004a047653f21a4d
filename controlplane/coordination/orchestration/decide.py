"""Pure failover and switchover decisions: who may take a dataset, and why not the others.

No I/O here: the inputs are a `ClusterView`, the placements and the topology, so
every rule is unit-testable and every refusal carries its reason.

The candidates of a dataset are its home region first (a dataset that was moved
away from home goes back there when its current owner is lost or drained), then
its `failover.order`; the region being moved away from is never a candidate, so it
is never listed as a "rejected candidate" either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.coordination.orchestration.prefer import Exposure
from controlplane.coordination.protocols.view import ClusterView, RegionState
from controlplane.domain.placement import Placement

MANUAL_REASON = "manual mode: failover.mode is manual; name --to to move it"


@dataclass(frozen=True, slots=True)
class Move:
    dataset: str
    from_region: str
    to_region: str
    epoch_before: int


@dataclass(frozen=True, slots=True)
class Rejection:
    dataset: str
    region: str
    reason: str


@dataclass(frozen=True, slots=True)
class Unmoved:
    """A dataset the plan cannot move, and why (one clause, for a sentence)."""

    dataset: str
    reason: str


@dataclass
class Plan:
    """What a runbook or the controller would do: moves, and every rejected candidate."""

    moves: list[Move] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    unmoved: list[Unmoved] = field(default_factory=list)
    # Owned by the source in etcd, yet no applied policy places them as critical (a
    # dataset retired, or made standard): nothing to move, and nothing that should stop
    # a drain or a failover. Their owner records are left as they are.
    retired: list[Unmoved] = field(default_factory=list)
    # RPO exposure of each move as the agents told it (orchestration/holders.py).
    exposures: dict[str, Exposure] = field(default_factory=dict)

    def unmoved_names(self) -> list[str]:
        return [u.dataset for u in self.unmoved]

    def as_json(self) -> dict[str, object]:
        return {
            "moves": [
                {
                    "dataset": m.dataset,
                    "from": m.from_region,
                    "to": m.to_region,
                    "epoch_before": m.epoch_before,
                }
                for m in self.moves
            ],
            "rejected": [
                {"region": r.region, "reason": r.reason, "dataset": r.dataset}
                for r in self.rejected
            ],
            "unmoved": [{"dataset": u.dataset, "reason": u.reason} for u in self.unmoved],
            "retired": [{"dataset": u.dataset, "reason": u.reason} for u in self.retired],
        }


def candidates(placement: Placement, source: str) -> list[str]:
    """Home first, then `failover.order`, without repeats and without `source`."""
    out: list[str] = []
    for region in (placement.home, *placement.failover_order):
        if region != source and region not in out:
            out.append(region)
    return out


def candidate_rejection(
    placement: Placement,
    region: str,
    view: ClusterView,
    jurisdictions: Mapping[str, str],
    *,
    source: str,
) -> str | None:
    """Why `region` may not take `placement`'s dataset, or None if it may."""
    if region == source:
        return "it is the region being moved away from"
    if region not in jurisdictions:
        return "unknown region: the topology does not have it"
    jur = jurisdictions[region]
    if jur not in placement.residency:
        allowed = ",".join(placement.residency)
        return f"residency: jurisdiction {jur} is outside the dataset's residency [{allowed}]"
    if not view.is_alive(region):
        return "dead: no live controller holds its liveness lease"
    state = view.state_of(region)
    if state is RegionState.DRAINING:
        return "draining: the region is being drained and takes no ownership"
    if state is RegionState.FENCED:
        return "fenced: the region is fenced by an operator"
    return None


def eligible_candidates(
    placement: Placement,
    view: ClusterView,
    jurisdictions: Mapping[str, str],
    *,
    source: str,
) -> list[str]:
    """The candidates (home, then `failover.order`) that may take the dataset now, in
    that order: those `candidate_rejection` finds nothing against."""
    return [
        r
        for r in candidates(placement, source)
        if candidate_rejection(placement, r, view, jurisdictions, source=source) is None
    ]


def _unmoved_reason(rejections: Sequence[Rejection], placement: Placement) -> str:
    if not rejections:
        return (
            f"no candidate region: its home {placement.home} is the region being moved "
            "away from and its failover.order names no other region"
        )
    # The short label of each rejection; the full reasons are in `Plan.rejected`.
    each = ", ".join(f"{r.region}: {r.reason.split(':')[0]}" for r in rejections)
    return f"no eligible candidate ({each})"


def plan_moves(
    view: ClusterView,
    placements: Sequence[Placement],
    jurisdictions: Mapping[str, str],
    *,
    source: str,
    to: str | None = None,
    automatic: bool,
    move_manual: bool = False,
) -> Plan:
    """Choose a successor for every dataset `source` owns.

    Candidates are `to` when given, else `candidates()` (home, then
    `failover.order`). Datasets in `manual` failover mode are moved only by an
    operator naming `--to`, or by a drain (`move_manual`); otherwise they are
    reported as rejected with reason "manual mode". Every dataset that stays with
    `source` is in `unmoved` with its reason, but one no applied policy places as
    critical any more, which is in `retired` (there is nothing to move).
    """
    plan = Plan()
    by_name = {p.dataset: p for p in placements}
    for dataset in view.owned_by(source):
        placement = by_name.get(dataset)
        owner = view.owners[dataset]
        if placement is None or placement.dataset_class != "critical":
            plan.retired.append(
                Unmoved(
                    dataset,
                    "no applied policy places it as a critical dataset: nothing to move "
                    "(its owner record is left as it is)",
                )
            )
            continue
        manual_blocked = automatic or (to is None and not move_manual)
        if placement.failover_mode == "manual" and manual_blocked:
            # Each candidate named (the contract's `region` is a region's name).
            plan.rejected.extend(
                Rejection(dataset, region, MANUAL_REASON)
                for region in candidates(placement, source)
            )
            plan.unmoved.append(Unmoved(dataset, MANUAL_REASON))
            continue
        regions = [to] if to is not None else candidates(placement, source)
        chosen: str | None = None
        rejections: list[Rejection] = []
        for region in regions:
            why = candidate_rejection(placement, region, view, jurisdictions, source=source)
            if why is None:
                chosen = region
                break
            rejections.append(Rejection(dataset, region, why))
        plan.rejected.extend(rejections)
        if chosen is None:
            plan.unmoved.append(Unmoved(dataset, _unmoved_reason(rejections, placement)))
        else:
            plan.moves.append(Move(dataset, source, chosen, owner.epoch))
    return plan
