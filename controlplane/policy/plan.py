"""`plan`: what applying a policy set would change in the catalog, field by field.

The current state is what the catalog reads (`Catalog.policy_state`): regions,
placements of the datasets, and links, policies and declared datasets from the
document of the last applied revision. Placements cover declared datasets and every dataset
already in the catalog (registered on first write).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.catalog.records import CatalogState, Placement
from controlplane.policy.compiler import PolicySet

Action = Literal["add", "change", "remove"]


@dataclass(frozen=True)
class Change:
    action: Action
    kind: str
    name: str
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "kind": self.kind,
            "name": self.name,
            "fields": {k: [old, new] for k, (old, new) in self.fields.items()},
        }


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists and scalars are leaves."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "value": value}


def diff_maps(kind: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    changes: list[Change] = []
    for name in sorted(set(old) | set(new)):
        before = flatten(old[name]) if name in old else {}
        after = flatten(new[name]) if name in new else {}
        fields = {
            k: (before.get(k), after.get(k))
            for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)
        }
        if name not in old:
            changes.append(Change("add", kind, name, fields))
        elif name not in new:
            changes.append(Change("remove", kind, name, fields))
        elif fields:
            changes.append(Change("change", kind, name, fields))
    return changes


def placement_fields(p: Placement) -> dict[str, Any]:
    """What a placement change lists: its JSON without the name it is keyed by and the
    labels (a declared dataset's labels change shows as a `Dataset` change)."""
    return {k: v for k, v in p.as_json().items() if k not in ("dataset", "labels")}


def compute_plan(
    state: CatalogState, policy: PolicySet
) -> tuple[list[Change], dict[str, Placement]]:
    """The changes, and the new placement of every dataset."""
    placements = policy.placements(state.datasets)
    doc = policy.document()
    changes = diff_maps(
        "Region",
        {n: {"jurisdiction": j} for n, j in state.regions.items()},
        doc["regions"],
    )
    changes += diff_maps("Link", state.document.get("links", {}), doc["links"])
    changes += diff_maps("ReplicationPolicy", state.document.get("policies", {}), doc["policies"])
    changes += diff_maps(
        "Dataset",
        {n: {"labels": labels} for n, labels in state.document.get("datasets", {}).items()},
        {n: {"labels": labels} for n, labels in doc["datasets"].items()},
    )
    changes += diff_maps(
        "Placement",
        {n: placement_fields(p) for n, p in state.placements.items()},
        {n: placement_fields(p) for n, p in placements.items()},
    )
    if state.head and state.document.get("topology") != doc["topology"]:
        changes.append(
            Change(
                "change",
                "Topology",
                doc["topology"],
                {"name": (state.document.get("topology"), doc["topology"])},
            )
        )
    return changes, placements


__all__ = ["CatalogState", "Change", "compute_plan", "diff_maps", "flatten"]
