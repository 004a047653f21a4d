"""Re-choose a failover plan's targets for the candidates that hold every acked version.

`plan_moves` picks the first eligible candidate (home, then `failover.order`);
`prefer_holders` asks an `Assessor` (the agents' records, controller/holdings_choice.py)
what each eligible candidate lacks and moves each dataset to the first that lacks
the fewest (orchestration/prefer.py), naming each candidate passed over and why.
It returns each move's RPO exposure as the agents told it, for the journal.

When the assessor cannot tell (no agent published a record, or etcd did not
answer) the plan's choice stands and the exposure is left to the catalog's probe.
An operator's `--to` is kept as given; only its exposure is measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from controlplane.coordination.orchestration.decide import (
    Move,
    Plan,
    Rejection,
    eligible_candidates,
)
from controlplane.coordination.orchestration.prefer import Assessment, Exposure, choose
from controlplane.coordination.protocols.view import ClusterView
from controlplane.domain.placement import Placement
from controlplane.errors import MeridianError
from controlplane.logs import get_logger

log = get_logger(__name__)


class Assessor(Protocol):
    async def assess(self, dataset: str, candidates: Sequence[str]) -> Assessment | None: ...


async def prefer_holders(
    plan: Plan,
    placements: Mapping[str, Placement],
    view: ClusterView,
    jurisdictions: Mapping[str, str],
    assessor: Assessor,
    *,
    keep_target: bool = False,
) -> dict[str, Exposure]:
    """Rewrite `plan.moves` in place (see the module docstring) and set `plan.exposures`;
    returns them too (by dataset)."""

    async def one(i: int, move: Move) -> tuple[str, Exposure] | None:
        placement = placements.get(move.dataset)
        eligible = (
            [move.to_region]
            if keep_target or placement is None
            else eligible_candidates(placement, view, jurisdictions, source=move.from_region)
        )
        if move.to_region not in eligible:
            eligible = [move.to_region]
        try:
            found = await assessor.assess(move.dataset, eligible)
        except MeridianError as exc:
            log.warning("holdings_unknown", dataset=move.dataset, error=str(exc))
            return None
        if found is None:
            return None
        chosen = choose(eligible, found.standings)
        standing = found.standings.get(chosen)
        passed = tuple(eligible[: eligible.index(chosen)])
        for region in passed:
            theirs = found.standings.get(region)
            lacks = (
                "an unknown number of" if theirs is None or theirs.lacks is None else theirs.lacks
            )
            plan.rejected.append(
                Rejection(
                    move.dataset,
                    region,
                    f"behind: it lacks {lacks} version(s) the live holders hold; "
                    f"{chosen} lacks {standing.lacks if standing else '?'}",
                )
            )
        if chosen != move.to_region:
            plan.moves[i] = Move(move.dataset, move.from_region, chosen, move.epoch_before)
        log.info(
            "failover_candidate_chosen",
            dataset=move.dataset,
            to=chosen,
            passed_over=list(passed),
            lacks=None if standing is None else standing.lacks,
            source=found.source,
        )
        if standing is None or standing.missing is None:
            return None
        return move.dataset, Exposure(standing.missing, found.source, found.holders, passed)

    done = await asyncio.gather(*(one(i, m) for i, m in enumerate(plan.moves)))
    plan.exposures.update(d for d in done if d is not None)
    return dict(plan.exposures)
