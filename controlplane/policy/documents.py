"""From raw YAML documents to typed models, with each pydantic error placed on its node."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from controlplane.policy.loader import PathKey, RawDocument
from controlplane.policy.models import (
    API_VERSION,
    KINDS,
    DatasetDoc,
    RegionSpec,
    ReplicationPolicy,
    Topology,
)
from controlplane.policy.problems import Problem


@dataclass(frozen=True)
class Parsed:
    """A typed document and the raw one it came from (for positions)."""

    raw: RawDocument
    model: Topology | ReplicationPolicy | DatasetDoc


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _model_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at `loc` (loc excludes that field)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        fields = {(f.alias or n): f for n, f in current.model_fields.items()}
        if part not in fields:
            return None
        current = _unwrap(fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/list/Annotated down to a model class, if there is one."""
    for _ in range(6):  # bounded: annotations nest only a few levels
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation
        elif origin in (list, tuple):
            annotation = get_args(annotation)[0]
        else:
            return annotation
    return annotation


def _field_names(model: type[BaseModel]) -> list[str]:
    return [(f.alias or n) for n, f in model.model_fields.items()]


def _dotted(loc: PathKey) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "document"


def _message(err: ErrorDetails, model: type[BaseModel]) -> tuple[str, bool]:
    """One sentence for a pydantic error; True when it points at the key, not the value."""
    loc = tuple(p for p in err["loc"] if not isinstance(p, str) or p not in KINDS)
    kind = err["type"]
    if kind == "extra_forbidden":
        name = str(loc[-1])
        parent = _model_at(model, loc[:-1])
        hint = did_you_mean(name, _field_names(parent)) if parent else ""
        where = _dotted(loc[:-1])
        return f"unknown field {name!r} in {where}{hint}", True
    if kind == "missing":
        return f"missing required field {_dotted(loc)!r}", False
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        msg = f"{msg}, got {err['input']!r}"
    return f"{_dotted(loc)}: {msg}", False


def salvage_regions(raw: RawDocument) -> dict[str, str]:
    """The well-formed regions of a topology that failed validation elsewhere, so that
    policies can still be checked against them in the same run."""
    spec = raw.data.get("spec") if isinstance(raw.data, dict) else None
    items = spec.get("regions") if isinstance(spec, dict) else None
    regions: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        try:
            region = RegionSpec.model_validate(item)
        except ValidationError:
            continue
        regions.setdefault(region.name, region.jurisdiction)
    return regions


def parse_document(raw: RawDocument) -> tuple[Parsed | None, list[Problem]]:
    """Check apiVersion and kind, then validate against the model of that kind."""
    data = raw.data
    if not isinstance(data, dict):
        return None, [raw.problem((), "a policy document must be a mapping")]
    problems: list[Problem] = []
    api = data.get("apiVersion")
    if "apiVersion" not in data:
        problems.append(raw.problem((), "missing required field 'apiVersion'"))
    elif api != API_VERSION:
        problems.append(
            raw.problem(("apiVersion",), f"unknown apiVersion {api!r}; expected {API_VERSION!r}")
        )
    kind = data.get("kind")
    if "kind" not in data:
        problems.append(raw.problem((), "missing required field 'kind'"))
        return None, problems
    if not isinstance(kind, str) or kind not in KINDS:
        hint = did_you_mean(str(kind), KINDS)
        problems.append(
            raw.problem(
                ("kind",),
                f"unknown kind {kind!r}; expected Topology, ReplicationPolicy or Dataset{hint}",
            )
        )
        return None, problems
    if problems:
        return None, problems
    model = KINDS[kind]
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            message, at_key = _message(err, model)
            loc: PathKey = tuple(err["loc"])
            if err["type"] == "missing":
                # Point at the key of the mapping that lacks the field.
                loc, at_key = loc[:-1], True
            problems.append(raw.problem(loc, message, key=at_key))
        return None, problems
    if not isinstance(parsed, Topology | ReplicationPolicy | DatasetDoc):
        raise TypeError(f"unexpected model {type(parsed).__name__}")  # KINDS holds only these
    return Parsed(raw, parsed), []
