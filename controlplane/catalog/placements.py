"""A dataset row ↔ its `Placement` (the columns queries filter on, and the whole as JSON)."""

from __future__ import annotations

from typing import Any

from controlplane.catalog.models import Dataset
from controlplane.catalog.records import Placement


def placement_of(row: Dataset) -> Placement | None:
    if row.policy is None or row.home is None or row.dataset_class is None:
        return None
    return Placement(
        dataset=row.name,
        policy=row.policy,
        dataset_class="critical" if row.dataset_class == "critical" else "standard",
        home=row.home,
        replicas=tuple(row.replicas),
        residency=tuple(row.residency),
        failover_mode="automatic" if row.failover_mode == "automatic" else "manual",
        failover_order=tuple(row.failover_order),
        labels=dict(row.labels),
    )


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
