"""A dataset row ↔ its `Placement` (the columns queries filter on, and the whole as JSON).

`datasets.placement` holds `Placement.as_json()`, every field of the placement;
the columns beside it repeat what queries filter on. A row written before the
placement carried its policy's terms (rpo, ack, transfer, deletes) has no such
JSON, or a partial one: its terms are read from the head revision's document,
which every row was compiled from (each apply rewrites every row, and a dataset
registered later is placed by the head revision), so such a row needs no
migration and is rewritten whole by the next apply that changes anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from controlplane.catalog.errors import CatalogInputError
from controlplane.catalog.models import Dataset, PolicyRevision
from controlplane.domain.placement import DatasetClass, FailoverMode, Placement

_TERMS_KEY = "meridian.legacy_policy_terms"


def placement_of(row: Dataset) -> Placement | None:
    """The placement of a dataset row, or None when no applied policy places it."""
    if row.policy is None or row.home is None or row.dataset_class is None:
        return None
    stored = row.placement
    if isinstance(stored, Mapping) and "rpo_s" in stored:
        return Placement.from_json(stored)
    return _legacy_placement(row)


def _legacy_placement(row: Dataset) -> Placement:
    # Only called for placed rows (checked by placement_of).
    session = object_session(row)
    if session is None:
        raise CatalogInputError(f"dataset {row.name}: its row is detached from a session")
    terms = _head_terms(session).get(str(row.policy))
    if terms is None:
        raise CatalogInputError(
            f"dataset {row.name} is placed by policy {row.policy!r}, which the last applied "
            "policy revision does not hold; run `meridian policy apply` again"
        )
    return Placement(
        dataset=row.name,
        policy=str(row.policy),
        # Checked by Placement itself: a bad stored value is refused, never guessed.
        dataset_class=cast(DatasetClass, row.dataset_class),
        home=str(row.home),
        replicas=tuple(row.replicas),
        residency=tuple(row.residency),
        failover_mode=cast(FailoverMode, row.failover_mode),
        failover_order=tuple(row.failover_order),
        labels=dict(row.labels),
        **terms,
    )


def _head_terms(s: Session) -> dict[str, dict[str, Any]]:
    """The placement terms of each policy of the head revision, by name; remembered for
    the rest of the session (a session sees one head)."""
    cached = s.info.get(_TERMS_KEY)
    if cached is None:
        head = s.scalars(select(PolicyRevision).order_by(PolicyRevision.id.desc())).first()
        policies = head.document.get("policies", {}) if head is not None else {}
        cached = {name: policy_terms(name, spec) for name, spec in policies.items()}
        s.info[_TERMS_KEY] = cached
    return cast(dict[str, dict[str, Any]], cached)


def policy_terms(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The placement terms of one policy in a revision document. The document is the
    catalog's own canonical form (durations in `s` or `ms`, bandwidths in `B/s`, as
    the policy compiler writes them), so reading it needs no policy package."""
    transfer = spec.get("transfer") or {}
    bandwidth = transfer.get("bandwidth")
    return {
        "rpo_s": _seconds(name, spec.get("rpo")),
        "ack": spec.get("ack"),
        "transfer_compression": transfer.get("compression", "zstd"),
        "transfer_bandwidth_bps": None if bandwidth is None else _bytes_per_s(name, bandwidth),
        "deletes": spec.get("deletes", "replicate"),
    }


def _seconds(policy: str, text: object) -> float:
    try:
        if isinstance(text, str) and text.endswith("ms"):
            return float(text[:-2]) / 1000
        if isinstance(text, str) and text.endswith("s"):
            return float(text[:-1])
    except ValueError:
        pass
    raise CatalogInputError(f"policy {policy!r} of the applied revision has a bad rpo {text!r}")


def _bytes_per_s(policy: str, text: object) -> float:
    try:
        if isinstance(text, str) and text.endswith("B/s"):
            return float(text[:-3])
    except ValueError:
        pass
    raise CatalogInputError(
        f"policy {policy!r} of the applied revision has a bad transfer bandwidth {text!r}"
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
