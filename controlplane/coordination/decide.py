"""Pure failover and switchover decisions: who may take a dataset, and why not the others.

No I/O here: the inputs are a `ClusterView`, the placements and the topology, so
every rule is unit-testable and every refusal carries its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.coordination.sources import PlacementInfo
from controlplane.coordination.view import ClusterView, RegionState


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


@dataclass
class Plan:
    """What a runbook or the controller would do: moves, and every rejected candidate."""

    moves: list[Move] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    unmoved: list[str] = field(default_factory=list)  # datasets with no eligible candidate

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
            "unmoved": list(self.unmoved),
        }


def candidate_rejection(
    placement: PlacementInfo,
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


def plan_moves(
    view: ClusterView,
    placements: Sequence[PlacementInfo],
    jurisdictions: Mapping[str, str],
    *,
    source: str,
    to: str | None = None,
    automatic: bool,
) -> Plan:
    """Choose a successor for every critical dataset `source` owns.

    Candidates are `to` when given, else the dataset's `failover.order`. Datasets
    in `manual` failover mode are only moved by an operator naming `--to`; an
    automatic decision reports them as rejected with reason "manual mode".
    """
    plan = Plan()
    by_name = {p.dataset: p for p in placements}
    for dataset in view.owned_by(source):
        placement = by_name.get(dataset)
        owner = view.owners[dataset]
        if placement is None or placement.dataset_class != "critical":
            continue
        if placement.failover_mode == "manual" and (automatic or to is None):
            plan.rejected.append(
                Rejection(
                    dataset, "*", "manual mode: failover.mode is manual; name --to to move it"
                )
            )
            plan.unmoved.append(dataset)
            continue
        candidates = [to] if to is not None else list(placement.failover_order)
        chosen: str | None = None
        for region in candidates:
            why = candidate_rejection(placement, region, view, jurisdictions, source=source)
            if why is None:
                chosen = region
                break
            plan.rejected.append(Rejection(dataset, region, why))
        if chosen is None:
            plan.unmoved.append(dataset)
        else:
            plan.moves.append(Move(dataset, source, chosen, owner.epoch))
    return plan
