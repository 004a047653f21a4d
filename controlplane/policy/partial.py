"""What could be parsed of a policy document, so every rule can run on it.

spec/policy.md wants all problems of all files in one run. A document with a field
error is therefore not dropped: its invalid nodes are blanked out (`None` means
"given, but unknown") and the rest is read into the loose models below, whose
fields are all optional. The rules in `rules.py` run on these loose models and skip
a check whose inputs are unknown, so that one error never causes a false second one.

A misspelt field (`priorty`) is treated as the field it was probably meant to be
(`priority`) with an unknown value, not as an absent field: an absent field would
take its default, and a rule could then complain about a value the user never wrote.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from controlplane.policy.models import Bandwidth, Duration, Jurisdiction, Name, RegionName

PathKey = tuple[str | int, ...]


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class LooseMetadata(Loose):
    name: Name | None = None
    labels: dict[str, str | None] | None = Field(default_factory=dict)


class LooseRegion(Loose):
    name: RegionName | None = None
    jurisdiction: Jurisdiction | None = None


class LooseLink(Loose):
    between: list[RegionName | None] | None = None
    rtt: Duration | None = None
    bandwidth: Bandwidth | None = None


class LooseTopologySpec(Loose):
    regions: list[LooseRegion | None] | None = None
    links: list[LooseLink | None] | None = Field(default_factory=list)


class LooseSelector(Loose):
    datasets: list[Name | None] | None = None
    labels: dict[str, str | None] | None = Field(default_factory=dict)


class LooseReplicas(Loose):
    regions: list[RegionName | None] | None = None
    count: int | None = None


class LooseFailover(Loose):
    mode: str | None = "manual"
    order: list[RegionName | None] | None = None


class LoosePolicySpec(Loose):
    priority: int | None = 0
    selector: LooseSelector | None = None
    class_: str | None = Field(default=None, alias="class")
    home: RegionName | None = None
    replicas: LooseReplicas | None = None
    residency: list[Jurisdiction | None] | None = None
    rpo: Duration | None = None
    ack: str | None = None
    failover: LooseFailover | None = Field(default_factory=LooseFailover)


class LooseTopology(Loose):
    metadata: LooseMetadata | None = None
    spec: LooseTopologySpec | None = None


class LoosePolicy(Loose):
    metadata: LooseMetadata | None = None
    spec: LoosePolicySpec | None = None


class LooseDataset(Loose):
    metadata: LooseMetadata | None = None


LOOSE_KINDS: dict[str, type[Loose]] = {
    "Topology": LooseTopology,
    "ReplicationPolicy": LoosePolicy,
    "Dataset": LooseDataset,
}


def _walk(data: Any, path: PathKey) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _holds(parent: Any, key: str | int) -> bool:
    if isinstance(parent, dict):
        return key in parent
    return isinstance(parent, list) and isinstance(key, int) and 0 <= key < len(parent)


def blank_out(data: Any, errors: list[ErrorDetails], meant: list[tuple[PathKey, str]]) -> Any:
    """A copy of `data` without unknown fields and with every invalid node set to None.

    `meant` lists (mapping path, field) for each misspelt field's likely intent:
    that field is set to None (unknown) when the mapping does not give it."""
    out = copy.deepcopy(data)
    for err in errors:
        loc: PathKey = tuple(err["loc"])
        if err["type"] == "missing" or not loc:
            continue
        parent, last = _walk(out, loc[:-1]), loc[-1]
        if err["type"] == "extra_forbidden":
            if isinstance(parent, dict):
                parent.pop(last, None)
        elif _holds(parent, last):
            parent[last] = None
    for path, name in meant:
        parent = _walk(out, path)
        if isinstance(parent, dict) and name not in parent:
            parent[name] = None
    return out


def read_loose(kind: str, data: Any) -> Loose | None:
    """The loose model of a blanked-out document, or None when even that fails."""
    try:
        return LOOSE_KINDS[kind].model_validate(data)
    except ValidationError:
        return None


def given(data: Any, path: PathKey) -> bool:
    """Whether the (blanked-out) document has a key at `path`, valid or not."""
    parent = _walk(data, path[:-1])
    return isinstance(parent, dict) and path[-1] in parent


def known_list(items: list[Any] | None) -> bool:
    """A list whose every item was valid."""
    return items is not None and all(i is not None for i in items)


def known_dict(items: dict[str, Any] | None) -> bool:
    return items is not None and all(v is not None for v in items.values())
