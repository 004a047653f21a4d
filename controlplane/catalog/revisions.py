"""The SQL half of `policy apply` and `policy plan`: read the applied state, commit a revision.

The policy package computes what a revision is (`RevisionDraft`, from a
`CatalogState`); this module reads that state and writes the draft, inside the
catalog, so no SQL lives outside it. All writes of one apply are one transaction
under the exclusive residency lock (see `api.residency_lock`), and the revision
row's unique `parent` makes a second apply planned against the same head fail
instead of stacking on it.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from controlplane.catalog.errors import StrandedReplicasError
from controlplane.catalog.models import (
    CatalogObject,
    Dataset,
    ObjectVersion,
    PolicyRevision,
    Region,
    Replica,
)
from controlplane.catalog.placements import placement_columns, placement_of
from controlplane.catalog.records import CatalogState, Placement, RevisionDraft

MAX_NAMED = 10

Decide = Callable[[CatalogState], RevisionDraft]


def read_state(s: Session) -> CatalogState:
    head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
    rows = s.scalars(select(Dataset)).all()
    return CatalogState(
        head=head.id if head else 0,
        head_digest=head.digest if head else None,
        document=head.document if head else {},
        regions={r.name: r.jurisdiction for r in s.scalars(select(Region)).all()},
        datasets={d.name: dict(d.labels) for d in rows},
        placements={p.dataset: p for p in map(placement_of, rows) if p is not None},
    )


def stranded(s: Session, state: CatalogState, draft: RevisionDraft) -> list[str]:
    """'dataset/object@version in region (J)' for replicas outside their new residency."""
    new_j = draft.regions
    # Regions whose jurisdiction changed or which left the topology.
    changed_regions = {r for r, j in state.regions.items() if new_j.get(r) != j}
    placements = draft.placements
    suspects = [
        name
        for name, p in placements.items()
        if changed_regions
        or (name in state.placements and set(state.placements[name].residency) != set(p.residency))
        or name not in state.placements
    ]
    found: list[str] = []
    for name in suspects:
        allowed = set(placements[name].residency)
        rows = s.execute(
            select(Replica.region, CatalogObject.key, ObjectVersion.version)
            .join(ObjectVersion, ObjectVersion.id == Replica.version_id)
            .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
            .where(CatalogObject.dataset == name)
            .where(
                Replica.region.in_(
                    [r for r, j in new_j.items() if j not in allowed]
                    + [r for r in state.regions if r not in new_j]
                )
            )
            .order_by(CatalogObject.key, ObjectVersion.hlc, Replica.region)
            .limit(MAX_NAMED + 1 - len(found))
        ).all()
        for region, key, version in rows:
            where = f"({new_j[region]})" if region in new_j else "(no longer in the topology)"
            found.append(f"{name}/{key}@{version} in {region} {where}")
        if len(found) > MAX_NAMED:
            break
    return found


def refuse_stranding(s: Session, state: CatalogState, draft: RevisionDraft) -> None:
    found = stranded(s, state, draft)
    if found:
        shown = "; ".join(found[:MAX_NAMED])
        more = " and more" if len(found) > MAX_NAMED else ""
        raise StrandedReplicasError(
            "apply refused: it would leave existing replicas outside their "
            f"dataset's residency: {shown}{more}; remove those replicas first (apply a "
            "policy that drops their regions from the placement, keeping the residency, "
            "then `meridian dataset evict DATASET --region REGION`)"
        )


def write(s: Session, state: CatalogState, draft: RevisionDraft, now: object) -> None:
    new_regions = draft.regions
    for name, j in new_regions.items():
        if name not in state.regions:
            s.add(Region(name=name, jurisdiction=j))
        elif state.regions[name] != j:
            s.execute(update(Region).where(Region.name == name).values(jurisdiction=j))
            s.execute(update(Replica).where(Replica.region == name).values(jurisdiction=j))
    for name in state.regions.keys() - new_regions.keys():
        s.execute(delete(Region).where(Region.name == name))

    declared = draft.declared
    placements = draft.placements
    for name in sorted(set(state.datasets) | set(declared) | set(placements)):
        labels = declared.get(name, state.datasets.get(name, {}))
        placement = placements.get(name)
        cols = placement_columns(placement)
        if name not in state.datasets:
            s.add(
                Dataset(
                    name=name, labels=labels, declared=name in declared, registered_at=now, **cols
                )
            )
            continue
        old: Placement | None = state.placements.get(name)
        s.execute(
            update(Dataset)
            .where(Dataset.name == name)
            .values(labels=labels, declared=name in declared, **cols)
        )
        new_res = list(placement.residency) if placement else []
        if old is None or list(old.residency) != new_res or state.regions != new_regions:
            rejudge(s, name, new_res)


def rejudge(s: Session, dataset: str, residency: list[str]) -> None:
    """Recompute the denormalised `allowed` of a dataset's replicas."""
    if not residency:
        # No policy places the dataset any more (its selector changed, say). That
        # is not a verdict that its copies are now fine: keep the judgement made
        # under the last residency, so a violation stays visible to auditors.
        return
    versions = (
        select(ObjectVersion.id)
        .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
        .where(CatalogObject.dataset == dataset)
        .scalar_subquery()
    )
    s.execute(
        update(Replica)
        .where(Replica.version_id.in_(versions))
        .values(allowed=Replica.jurisdiction.in_(residency))
    )
