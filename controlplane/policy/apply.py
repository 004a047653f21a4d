"""`apply`: write a valid policy set to the catalog as one revision, then publish it.

All catalog writes happen in one transaction. Two applies never interleave: the
transaction takes the writer lock first (an advisory lock on PostgreSQL, the
database write lock on SQLite), and the revision row's unique `parent` makes a
second apply planned against the same head fail instead of stacking on it.
Applying a set that changes nothing records nothing. The etcd key is written after
the commit and always names the catalog's head, so re-running apply republishes.
"""

from __future__ import annotations

import asyncio
import getpass
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from controlplane.catalog.api import Catalog, placement_columns, residency_lock, utcnow
from controlplane.catalog.errors import CatalogConflictError
from controlplane.catalog.models import (
    CatalogObject,
    Dataset,
    ObjectVersion,
    PolicyRevision,
    Region,
    Replica,
)
from controlplane.catalog.records import Placement
from controlplane.errors import RefusedError
from controlplane.policy.compiler import PolicySet
from controlplane.policy.current import CompiledPolicy
from controlplane.policy.plan import CatalogState, Change, compute_plan, read_state
from controlplane.policy.publisher import PolicyPublisher

MAX_NAMED = 10


class StrandedReplicasError(RefusedError):
    """Applying would leave existing replicas outside their dataset's new residency."""


@dataclass(frozen=True)
class ApplyResult:
    changes: list[Change]
    revision: int
    digest: str
    applied_at: datetime
    published: bool


def describe_source(paths: Sequence[Path]) -> str:
    """The git commit holding the files (with `+dirty` if they differ), else their paths."""
    names = ",".join(str(p) for p in paths)
    if not paths:
        return names
    folder = paths[0].resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--", *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return names
    return f"git:{sha}{'+dirty' if dirty else ''} {names}"


def _lock(s: Session) -> None:
    # Exclusive: a second apply waits, and so do writes judging copies against a
    # residency (on SQLite, a second writer waits in busy_timeout instead of both
    # reading and then one failing to upgrade).
    residency_lock(s, exclusive=True)


def _stranded(
    s: Session, state: CatalogState, policy: PolicySet, placements: dict[str, Placement]
) -> list[str]:
    """'dataset/object@version in region (J)' for replicas outside their new residency."""
    new_j = policy.regions
    # Regions whose jurisdiction changed or which left the topology.
    changed_regions = {r for r, j in state.regions.items() if new_j.get(r) != j}
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
            .order_by(CatalogObject.key, ObjectVersion.version, Replica.region)
            .limit(MAX_NAMED + 1 - len(found))
        ).all()
        for region, key, version in rows:
            where = f"({new_j[region]})" if region in new_j else "(no longer in the topology)"
            found.append(f"{name}/{key}@{version} in {region} {where}")
        if len(found) > MAX_NAMED:
            break
    return found


def _write(
    s: Session, state: CatalogState, policy: PolicySet, placements: dict[str, Placement]
) -> None:
    new_regions = policy.regions
    for name, j in new_regions.items():
        if name not in state.regions:
            s.add(Region(name=name, jurisdiction=j))
        elif state.regions[name] != j:
            s.execute(update(Region).where(Region.name == name).values(jurisdiction=j))
            s.execute(update(Replica).where(Replica.region == name).values(jurisdiction=j))
    for name in state.regions.keys() - new_regions.keys():
        s.execute(delete(Region).where(Region.name == name))

    declared = policy.declared
    now = utcnow()
    for name in sorted(set(state.datasets) | set(declared) | set(placements)):
        labels = declared.get(name, state.datasets.get(name, {}))
        placement = placements.get(name)
        cols = (
            placement_columns(placement)
            if placement
            else {
                "policy": None,
                "dataset_class": None,
                "home": None,
                "replicas": [],
                "residency": [],
                "failover_mode": None,
                "failover_order": [],
            }
        )
        if name not in state.datasets:
            s.add(
                Dataset(
                    name=name, labels=labels, declared=name in declared, registered_at=now, **cols
                )
            )
            continue
        old = state.placements.get(name)
        s.execute(
            update(Dataset)
            .where(Dataset.name == name)
            .values(labels=labels, declared=name in declared, **cols)
        )
        new_res = list(placement.residency) if placement else []
        if old is None or list(old.residency) != new_res or state.regions != new_regions:
            _rejudge(s, name, new_res, new_regions)


def _rejudge(s: Session, dataset: str, residency: list[str], regions: dict[str, str]) -> None:
    """Recompute the denormalised `allowed` of a dataset's replicas."""
    versions = (
        select(ObjectVersion.id)
        .join(CatalogObject, CatalogObject.id == ObjectVersion.object_id)
        .where(CatalogObject.dataset == dataset)
        .scalar_subquery()
    )
    if not residency:
        # No policy places the dataset any more (its selector changed, say). That
        # is not a verdict that its copies are now fine: keep the judgement made
        # under the last residency, so a violation stays visible to auditors.
        return
    s.execute(
        update(Replica)
        .where(Replica.version_id.in_(versions))
        .values(allowed=Replica.jurisdiction.in_(residency))
    )


def plan_changes(catalog: Catalog, policy: PolicySet) -> list[Change]:
    with catalog.session() as s:
        changes, _ = compute_plan(read_state(s), policy)
        return changes


def apply_policy(
    catalog: Catalog,
    policy: PolicySet,
    *,
    source: str,
    publisher: PolicyPublisher | None,
    applied_by: str | None = None,
) -> ApplyResult:
    """Apply `policy`; refuse stranding replicas; publish the head when a publisher is given."""
    user = applied_by or getpass.getuser()
    try:
        with catalog.session() as s, s.begin():
            _lock(s)
            state = read_state(s)
            changes, placements = compute_plan(state, policy)
            if changes:
                stranded = _stranded(s, state, policy, placements)
                if stranded:
                    shown = "; ".join(stranded[:MAX_NAMED])
                    more = " and more" if len(stranded) > MAX_NAMED else ""
                    raise StrandedReplicasError(
                        "apply refused: it would leave existing replicas outside their "
                        f"dataset's residency: {shown}{more}; remove those replicas first"
                    )
                _write(s, state, policy, placements)
                rev = PolicyRevision(
                    parent=state.head,
                    digest=policy.digest,
                    source=source,
                    applied_by=user,
                    applied_at=utcnow(),
                    document=policy.document(),
                )
                s.add(rev)
                s.flush()
                revision, digest, applied_at = rev.id, rev.digest, rev.applied_at
            else:
                head = s.get(PolicyRevision, state.head) if state.head else None
                revision = head.id if head else 0
                digest = head.digest if head else policy.digest
                applied_at = head.applied_at if head else utcnow()
    except IntegrityError as exc:
        raise CatalogConflictError(
            "another `policy apply` committed first; run `meridian policy plan` and apply again"
        ) from exc
    except OperationalError as exc:
        if "locked" in str(exc).lower():
            raise CatalogConflictError(
                "another `policy apply` is running on this catalog; try again when it is done"
            ) from exc
        raise

    published = False
    if publisher is not None and revision:
        compiled = CompiledPolicy.build(
            policy, placements, digest=digest, revision=revision, applied_at=applied_at
        )
        asyncio.run(publisher.publish(compiled))
        published = True
    return ApplyResult(changes, revision, digest, applied_at, published)


def revision_count(catalog: Catalog) -> int:
    with catalog.session() as s:
        return int(s.scalar(select(func.count()).select_from(PolicyRevision)) or 0)
