"""Checks of the agent API's request fields, each failure one `InvalidInputError` whose
message starts with the field's dotted path (`PutHeader.key name '../x' ...`), so the
client learns what was wrong and where before anything is touched."""

from __future__ import annotations

from typing import NamedTuple

from agents.store import check_name
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest
from controlplane.errors import InvalidInputError
from meridian.convert import hlc_from_wire
from meridian.v1 import agent_pb2

DEFAULT_PAGE = 1000
MAX_PAGE = 10_000


def name(path: str, value: str) -> str:
    """A dataset, key, set or prefix name (the store's rules)."""
    return check_name(path, value)


def optional_name(path: str, present: bool, value: str) -> str | None:
    return name(path, value) if present else None


def set_id(path: str, present: bool, value: str) -> str | None:
    """A set id to write in: a name, and not the reserved "latest"."""
    found = optional_name(path, present, value)
    if found == "latest":
        raise InvalidInputError(f"{path}: 'latest' is reserved (it names the newest set)")
    return found


def version(path: str, present: bool, value: str) -> HLC | None:
    """An optional HLC text naming a version."""
    return hlc_from_wire(value, path) if present else None


def epoch(present: bool, value: int) -> int | None:
    # Epochs are etcd revisions (>= 1): a stated 0 is a client's "none" in proto3 terms.
    return value if present and value > 0 else None


def digest(path: str, present: bool, value: str) -> Digest | None:
    if not present:
        return None
    try:
        return Digest.parse(value)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{path}: {exc}") from exc


def page_size(path: str, value: int) -> int:
    if value == 0:
        return DEFAULT_PAGE
    if value > MAX_PAGE:
        raise InvalidInputError(f"{path}: at most {MAX_PAGE} objects per page, got {value}")
    return value


class ListQuery(NamedTuple):
    dataset: str
    prefix: str
    limit: int


def list_query(request: agent_pb2.ListRequest) -> ListQuery:
    """A List's fields checked: by the agent asked before it asks anyone else, so a bad
    request is refused as bad, not as whatever the region's state makes of it."""
    return ListQuery(
        name("ListRequest.dataset", request.dataset),
        name("ListRequest.prefix", request.prefix) if request.prefix else "",
        page_size("ListRequest.page_size", request.page_size),
    )


def set_query(request: agent_pb2.GetSetRequest) -> tuple[str, str]:
    """A GetSet's dataset and the set it wants (a set id, or "latest")."""
    dataset = name("GetSetRequest.dataset", request.dataset)
    if not request.set:
        raise InvalidInputError("GetSetRequest.set is missing (a set id, or 'latest')")
    wanted = request.set if request.set == "latest" else name("GetSetRequest.set", request.set)
    return dataset, wanted
