"""Audit queries: the answers behind `meridian audit ...`, over the catalog's views.

`residency` and `cross-border transfers` read the views `residency_violations` and
`cross_border_transfers` (migration 0002), which rest on partial indexes of the
denormalised `allowed` / `cross_border` columns, so they stay fast at millions of
rows. Times are returned timezone-aware in UTC.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from sqlalchemy import and_, select, text
from sqlalchemy.orm import Session

from controlplane.catalog.models import CatalogObject, Dataset, ObjectVersion, Replica, Transfer
from controlplane.errors import NotFoundError


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns view columns untyped
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected a timestamp from the catalog, got {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _json_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = json.loads(value)
    return [str(v) for v in value or []]


def rfc3339(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


MAX_IN_LIST = 500


def residency_violations(s: Session) -> list[dict[str, Any]]:
    """Every replica, and every past transfer, outside its dataset's residency."""
    rows = s.execute(
        text(
            "SELECT kind, dataset, object, version, region, jurisdiction, allowed, state, at "
            "FROM residency_violations ORDER BY at, kind, dataset, object, region"
        )
    ).mappings()
    return [
        {
            "kind": r["kind"],
            "dataset": r["dataset"],
            "object": r["object"],
            "version": r["version"],
            "region": r["region"],
            "jurisdiction": r["jurisdiction"],
            "allowed": _json_list(r["allowed"]),
            "state": r["state"],
            "at": rfc3339(_utc(r["at"])),
        }
        for r in rows
    ]


def glob_to_like(glob: str) -> str:
    """A LIKE pattern that matches at least what the shell glob does (prefilter)."""
    head = re.split(r"[\[]", glob, maxsplit=1)[0]
    out = head.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    out = out.replace("*", "%").replace("?", "_")
    return out if head == glob else out + "%"


def transfers(
    s: Session,
    *,
    since: datetime | None = None,
    dataset_glob: str | None = None,
    cross_border: bool = False,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Who copied what, from where to where, when, and how many bytes; oldest first.

    A dataset glob is resolved against the datasets table first (every transfer's
    dataset is registered there), so the query is an index range per dataset on
    (dataset, at) on both databases; a glob matching very many datasets falls back
    to a LIKE prefilter."""
    t = Transfer
    query = select(t)
    if cross_border:
        query = query.where(t.cross_border)
    if since is not None:
        query = query.where(t.at >= since)
    post_filter = False
    if dataset_glob:
        names = [n for n in s.scalars(select(Dataset.name)) if fnmatchcase(n, dataset_glob)]
        if len(names) <= MAX_IN_LIST:
            query = query.where(t.dataset.in_(names))
        else:
            query = query.where(t.dataset.like(glob_to_like(dataset_glob), escape="\\"))
            post_filter = True
    query = query.order_by(t.at, t.id)
    if limit is not None and not post_filter:
        query = query.limit(limit)
    out: list[dict[str, Any]] = []
    for row in s.scalars(query):
        if post_filter and not fnmatchcase(row.dataset, dataset_glob or "*"):
            continue
        if limit is not None and len(out) >= limit:
            break
        out.append(
            {
                "id": row.id,
                "dataset": row.dataset,
                "object": row.object,
                "version": row.version,
                "from": row.from_region,
                "to": row.to_region,
                "from_jurisdiction": row.from_jurisdiction,
                "to_jurisdiction": row.to_jurisdiction,
                "logical_bytes": row.logical_bytes,
                "wire_bytes": row.wire_bytes,
                "at": rfc3339(row.at),
                "outcome": row.outcome,
            }
        )
    return out


def dataset_locations(s: Session, name: str) -> list[dict[str, Any]]:
    """Where each version of each object of a dataset lives, with digests and states."""
    if s.get(Dataset, name) is None:
        raise NotFoundError(f"dataset {name!r} is not in the catalog")
    query = (
        select(
            CatalogObject.key,
            ObjectVersion.version,
            ObjectVersion.digest,
            ObjectVersion.size,
            Replica.region,
            Replica.jurisdiction,
            Replica.state,
            Replica.allowed,
            Replica.updated_at,
        )
        .join(ObjectVersion, ObjectVersion.object_id == CatalogObject.id)
        .outerjoin(Replica, and_(Replica.version_id == ObjectVersion.id))
        .where(CatalogObject.dataset == name)
        .order_by(CatalogObject.key, ObjectVersion.hlc, Replica.region)
    )
    return [
        {
            "object": r.key,
            "version": r.version,
            "digest": r.digest,
            "size": r.size,
            "region": r.region,
            "jurisdiction": r.jurisdiction,
            "state": r.state,
            "allowed": r.allowed,
            "at": rfc3339(r.updated_at),
        }
        for r in s.execute(query)
    ]
