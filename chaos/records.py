"""The records the checkers read besides the history, and their JSON-line formats.

These are the contract between the system under test and the chaos suite: each
component writes (or exposes) exactly these fields, and `parse_*` reads them
back with one clear error per malformed line.

* **AcceptRecord** — one per critical write decision, from the agent (or, until
  the agents exist, the controller's fenced canary: `writes.log` of its fence
  directory, whose lines already have these fields):
  `{"dataset", "epoch", "region", "writer", "accepted": bool, "t": unix seconds}`.
  The agent's log already carries the accepted ones: `object_stored`,
  `object_deleted` and `set_committed` events with `dataset` and `epoch` and a
  structlog `timestamp` (`accepts_from_agent_log` reads them).
* **OwnerSample** — an owner record read from etcd during the run (the harness
  samples `/meridian/owners/`): `{"dataset", "region", "epoch", "t"}`.
* **Copy** — one inventory line: a copy of (part of) a dataset in a region:
  `{"region", "dataset" (or null: a file the agent cannot attribute), "key",
  "kind": "object"|"tmp"|"catalog_replica"|"catalog_transfer"|"dlq", "where"}`.
* **ObjectState** — the newest version a region holds of one object after heal:
  `{"region", "dataset", "key", "version" (HLC text), "digest", "op"}`.
* **ApplyRecord** — one per change event per destination region, from the
  replicator: `{"region", "event_id", "dataset", "key", "version", "outcome":
  "applied"|"superseded"|"own"|"refused", "t"}`; `applied` means the effect
  reached the agent.
* **PublishedEvent** — one per change event in `meridian.changes` (read back
  from Kafka by the harness): `{"event_id", "dataset", "key", "version",
  "origin", "partition", "offset"}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeVar

CopyKind = Literal["object", "tmp", "catalog_replica", "catalog_transfer", "dlq"]
ApplyOutcome = Literal["applied", "superseded", "own", "refused"]


@dataclass(frozen=True, slots=True)
class AcceptRecord:
    dataset: str
    epoch: int
    region: str
    writer: str
    accepted: bool
    t: float


@dataclass(frozen=True, slots=True)
class OwnerSample:
    dataset: str
    region: str
    epoch: int
    t: float


@dataclass(frozen=True, slots=True)
class Copy:
    region: str
    dataset: str | None
    key: str
    kind: CopyKind
    where: str


@dataclass(frozen=True, slots=True)
class ObjectState:
    region: str
    dataset: str
    key: str
    version: str
    digest: str
    op: str = "put"


@dataclass(frozen=True, slots=True)
class ApplyRecord:
    region: str
    event_id: str
    dataset: str
    key: str
    version: str
    outcome: ApplyOutcome
    t: float


@dataclass(frozen=True, slots=True)
class PublishedEvent:
    event_id: str
    dataset: str
    key: str
    version: str
    origin: str
    partition: int
    offset: int


R = TypeVar("R")


def _field(raw: Mapping[str, object], name: str, kind: type, where: str) -> object:
    if name not in raw:
        raise ValueError(f"{where}: missing field {name!r} in {dict(raw)!r}")
    value = raw[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise ValueError(f"{where}: field {name!r} is a boolean, not an integer")
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {name!r} is {value!r}, not a {kind.__name__}")
    return value


def parse_accepts(lines: Iterable[Mapping[str, object]], where: str) -> list[AcceptRecord]:
    out = []
    for n, raw in enumerate(lines, start=1):
        w = f"{where} line {n}"
        out.append(
            AcceptRecord(
                dataset=str(_field(raw, "dataset", str, w)),
                epoch=int(_field(raw, "epoch", int, w)),  # type: ignore[call-overload]
                region=str(raw.get("region") or _field(raw, "writer", str, w)),
                writer=str(raw.get("writer", "")),
                accepted=bool(_field(raw, "accepted", bool, w)),
                t=float(_field(raw, "t", float, w)),  # type: ignore[arg-type]
            )
        )
    return out


def parse_copies(lines: Iterable[Mapping[str, object]], where: str) -> list[Copy]:
    kinds = ("object", "tmp", "catalog_replica", "catalog_transfer", "dlq")
    out = []
    for n, raw in enumerate(lines, start=1):
        w = f"{where} line {n}"
        kind = str(_field(raw, "kind", str, w))
        if kind not in kinds:
            raise ValueError(f"{w}: kind {kind!r} is not one of {', '.join(kinds)}")
        dataset = raw.get("dataset")
        out.append(
            Copy(
                region=str(_field(raw, "region", str, w)),
                dataset=None if dataset is None else str(dataset),
                key=str(raw.get("key", "")),
                kind=kind,  # type: ignore[arg-type]
                where=str(raw.get("where", "")),
            )
        )
    return out


AGENT_WRITE_EVENTS = frozenset({"object_stored", "object_deleted", "set_committed"})


def accepts_from_agent_log(
    lines: Iterable[str], region: str, agent: str, where: str
) -> list[AcceptRecord]:
    """Accept records from an agent's JSON log: each committed critical write
    (`object_stored`, `object_deleted`, `set_committed` with an `epoch`) at its
    structlog `timestamp`. Other lines (and non-JSON ones) are skipped."""
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.startswith("{"):
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if raw.get("event") not in AGENT_WRITE_EVENTS or raw.get("epoch") in (None, 0):
            continue
        try:
            t = datetime.fromisoformat(str(raw["timestamp"]).replace("Z", "+00:00")).timestamp()
            out.append(AcceptRecord(str(raw["dataset"]), int(raw["epoch"]), region, agent, True, t))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} line {n}: a write record without {exc}") from exc
    return out
