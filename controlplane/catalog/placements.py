"""A dataset row ↔ its `Placement`.

The whole placement is stored as JSON (`datasets.placement`, `Placement.as_json()`)
and read back with `Placement.from_json`, which checks every field; the columns
beside it repeat the parts that queries filter on (policy, class, home, replicas,
residency, failover). `policy apply` rewrites both for every dataset, and migration
0004 filled the JSON of rows written before it.
"""

from __future__ import annotations

from typing import Any

from controlplane.catalog.errors import CatalogError
from controlplane.catalog.models import Dataset
from controlplane.domain.errors import PlacementError
from controlplane.domain.placement import Placement


def placement_of(row: Dataset) -> Placement | None:
    """The placement stored in a `datasets` row, or None if no applied policy places it."""
    if row.policy is None:
        return None
    if row.placement is None:
        raise CatalogError(
            f"dataset {row.name} is placed by policy {row.policy!r} but its placement was "
            "stored without its terms; run `meridian policy apply` again"
        )
    try:
        return Placement.from_json(row.placement)
    except PlacementError as exc:
        raise CatalogError(f"dataset {row.name}: the stored placement is invalid: {exc}") from exc


UNPLACED: dict[str, Any] = {
    "policy": None,
    "dataset_class": None,
    "home": None,
    "replicas": [],
    "residency": [],
    "failover_mode": None,
    "failover_order": [],
    "placement": None,
}


def placement_columns(p: Placement | None) -> dict[str, Any]:
    if p is None:
        return dict(UNPLACED)
    return {
        "policy": p.policy,
        "dataset_class": p.dataset_class,
        "home": p.home,
        "replicas": list(p.replicas),
        "residency": list(p.residency),
        "failover_mode": p.failover_mode,
        "failover_order": list(p.failover_order),
        "placement": p.as_json(),
    }
