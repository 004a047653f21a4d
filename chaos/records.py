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
from typing import Any, Literal, TypeVar

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


_DECODER = json.JSONDecoder()


def json_record(line: str) -> dict[str, Any] | None:
    """The JSON object a daemon's log line carries, or None when it carries none.

    Our own lines are whole (controlplane.logs.LineLogger writes each in one call),
    but the interpreter writes to the same stderr too, some of it in pieces (the
    unraisable-exception hook, asyncio's "Task was destroyed"): text may precede or
    follow a record on its line. CI lost a replicator's record that way, and the
    checker called its event never processed. So the record is the first whole
    object found on the line, not the line."""
    at = line.find('{"')
    for _try in range(8):  # bounded: a few objects' worth of stray text
        if at < 0:
            return None
        try:
            raw, _end = _DECODER.raw_decode(line, at)
        except ValueError:
            at = line.find('{"', at + 1)
            continue
        return raw if isinstance(raw, dict) else None
    return None


AGENT_WRITE_EVENTS = frozenset({"object_stored", "object_deleted", "set_committed"})


def accepts_from_agent_log(
    lines: Iterable[str], region: str, agent: str, where: str
) -> list[AcceptRecord]:
    """Accept records from an agent's JSON log: each committed critical write
    (`object_stored`, `object_deleted`, `set_committed` with an `epoch`) at its
    admission time, and each `stale_epoch_refused` as a refusal. Other lines (and
    non-JSON ones) are skipped."""
    out = []
    for n, line in enumerate(lines, start=1):
        raw = json_record(line)
        if raw is None:
            continue
        event = raw.get("event")
        accepted = event in AGENT_WRITE_EVENTS
        if not (accepted or event == "stale_epoch_refused") or raw.get("epoch") in (None, 0):
            continue
        try:
            # The admission decision's time when the agent logs it (`admitted_at`), else
            # the commit's: an epoch is judged current at admission, not at commit.
            t = (
                float(raw["admitted_at"])
                if isinstance(raw.get("admitted_at"), int | float)
                else _timestamp(raw)
            )
            out.append(
                AcceptRecord(str(raw["dataset"]), int(raw["epoch"]), region, agent, accepted, t)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} line {n}: a write record without {exc}") from exc
    return out


def _timestamp(raw: Mapping[str, object]) -> float:
    return datetime.fromisoformat(str(raw["timestamp"]).replace("Z", "+00:00")).timestamp()


# The replicator's `event_applied` outcomes (replicator/applier.py) → an ApplyRecord's.
APPLY_OUTCOMES: dict[str, ApplyOutcome] = {
    "applied": "applied",
    "same": "superseded",
    "older": "superseded",
    "collision": "superseded",
    "retained": "superseded",
    "skipped": "superseded",
    "own": "own",
    "refused": "refused",
    "dead-lettered": "refused",
    "failed": "refused",
}


def applies_from_replicator_log(lines: Iterable[str], where: str) -> list[ApplyRecord]:
    """Apply records from a replicator's JSON log (`event_applied` lines)."""
    out = []
    for n, line in enumerate(lines, start=1):
        raw = json_record(line)
        if raw is None:
            continue
        if raw.get("event") != "event_applied":
            continue
        w = f"{where} line {n}"
        outcome = str(_field(raw, "outcome", str, w))
        if outcome not in APPLY_OUTCOMES:
            raise ValueError(f"{w}: outcome {outcome!r} is not one the replicator logs")
        out.append(
            ApplyRecord(
                region=str(_field(raw, "region", str, w)),
                event_id=str(_field(raw, "event_id", str, w)),
                dataset=str(_field(raw, "dataset", str, w)),
                key=str(_field(raw, "key", str, w)),
                version=str(_field(raw, "version", str, w)),
                outcome=APPLY_OUTCOMES[outcome],
                t=float(_field(raw, "t", float, w)),  # type: ignore[arg-type]
            )
        )
    return out
