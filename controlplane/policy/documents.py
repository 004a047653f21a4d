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
    ReplicationPolicy,
    Topology,
)
from controlplane.policy.partial import Loose, blank_out, read_loose
from controlplane.policy.problems import Problem


@dataclass(frozen=True)
class Checked:
    """One document after parsing: its problems, its typed model when it has none,
    and what could be parsed of it (`loose`, read from `blanked`) either way."""

    raw: RawDocument
    model: Topology | ReplicationPolicy | DatasetDoc | None
    loose: Loose | None
    blanked: Any
    problems: list[Problem]


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


def parse_document(raw: RawDocument) -> Checked:
    """Check apiVersion and kind, then validate against the model of that kind; keep
    what could be parsed of an invalid document for the cross-field rules."""
    data = raw.data
    if not isinstance(data, dict):
        return Checked(
            raw, None, None, None, [raw.problem((), "a policy document must be a mapping")]
        )
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
        return Checked(raw, None, None, None, problems)
    if not isinstance(kind, str) or kind not in KINDS:
        hint = did_you_mean(str(kind), KINDS)
        problems.append(
            raw.problem(
                ("kind",),
                f"unknown kind {kind!r}; expected Topology, ReplicationPolicy or Dataset{hint}",
            )
        )
        return Checked(raw, None, None, None, problems)
    model = KINDS[kind]
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if tuple(e["loc"]) != ("apiVersion",)]
        meant = _meant_fields(errors, model)
        for err in errors:
            loc: PathKey = tuple(err["loc"])
            if err["type"] == "missing" and (loc[:-1], str(loc[-1])) in meant:
                continue  # the misspelt field's "did you mean" already says it
            message, at_key = _message(err, model)
            if err["type"] == "missing":
                # Point at the key of the mapping that lacks the field.
                loc, at_key = loc[:-1], True
            problems.append(raw.problem(loc, message, key=at_key))
        blanked = blank_out(data, errors, list(meant))
        return Checked(raw, None, read_loose(kind, blanked), blanked, problems)
    if not isinstance(parsed, Topology | ReplicationPolicy | DatasetDoc):
        raise TypeError(f"unexpected model {type(parsed).__name__}")  # KINDS holds only these
    return Checked(raw, parsed, read_loose(kind, data), data, [])


def _meant_fields(errors: list[ErrorDetails], model: type[BaseModel]) -> set[tuple[PathKey, str]]:
    """(mapping path, field) for each unknown field that looks like a misspelt known one."""
    meant: set[tuple[PathKey, str]] = set()
    for err in errors:
        if err["type"] != "extra_forbidden":
            continue
        loc: PathKey = tuple(err["loc"])
        parent = _model_at(model, loc[:-1])
        if parent is None:
            continue
        close = difflib.get_close_matches(str(loc[-1]), _field_names(parent), n=1, cutoff=0.6)
        if close:
            meant.add((loc[:-1], close[0]))
    return meant
