"""The history of a chaos run: what clients invoked and what they saw, in one clock.

Jepsen's shape. Every operation is an `invoke` event followed by at most one
completion: `ok` (it took effect), `fail` (it certainly did not) or `info` (the
outcome is unknown: a timeout, a cut connection; an `info` write may take effect
at any later time, so checkers treat it as maybe-applied forever). An operation
never completed by the end of the run counts as `info`.

Times come from `time.monotonic_ns()` of the harness process only, so they order
every event of the run. Each write carries a unique `op_id` (also the value
written), so a final read can say exactly which writes survived.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

EventType = Literal["invoke", "ok", "fail", "info"]
COMPLETIONS: frozenset[str] = frozenset({"ok", "fail", "info"})


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the history."""

    index: int
    time_ns: int
    process: str  # the single-threaded client that acted, e.g. "eu-west/0"
    type: EventType
    f: str  # "write", "read", "delete", "commit_set"
    op_id: str
    region: str
    dataset: str
    key: str = ""
    # What the operation carried or saw: digest, version (HLC text), epoch, members
    # of a set (key -> digest), error text. Checkers read only documented fields.
    value: Mapping[str, object] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        out["value"] = dict(self.value)
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, object], where: str = "history") -> Event:
        try:
            kind = str(raw["type"])
            if kind not in ("invoke", *COMPLETIONS):
                raise ValueError(f"type {kind!r} is not invoke, ok, fail or info")
            value = raw.get("value", {})
            if not isinstance(value, Mapping):
                raise ValueError("value is not an object")
            return cls(
                index=int(raw["index"]),  # type: ignore[call-overload]
                time_ns=int(raw["time_ns"]),  # type: ignore[call-overload]
                process=str(raw["process"]),
                type=kind,  # type: ignore[arg-type]
                f=str(raw["f"]),
                op_id=str(raw["op_id"]),
                region=str(raw["region"]),
                dataset=str(raw["dataset"]),
                key=str(raw.get("key", "")),
                value=dict(value),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: event {dict(raw)!r} is malformed: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Operation:
    """An invoke and its completion (None: never completed, which reads as `info`)."""

    invoke: Event
    complete: Event | None

    @property
    def outcome(self) -> str:
        return self.complete.type if self.complete is not None else "info"

    @property
    def op_id(self) -> str:
        return self.invoke.op_id

    @property
    def f(self) -> str:
        return self.invoke.f

    def seen(self, name: str) -> object:
        """A field of the completion's value, else of the invoke's (what was sent)."""
        if self.complete is not None and name in self.complete.value:
            return self.complete.value[name]
        return self.invoke.value.get(name)

    def describe(self) -> str:
        c = self.complete
        tail = f"{c.type} {dict(c.value)}" if c is not None else "never completed"
        return (
            f"{self.invoke.process} {self.f} {self.invoke.dataset}/{self.invoke.key} "
            f"id={self.op_id} in {self.invoke.region}: {tail}"
        )


class History:
    """An append-only, thread-safe history. Clients call `invoke` then one completion."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = list(events)
        self._counter = itertools.count(len(self._events))
        self._open: dict[str, Event] = {}
        for e in self._events:
            if e.type == "invoke":
                self._open[e.op_id] = e
            else:
                self._open.pop(e.op_id, None)

    @staticmethod
    def new_id(prefix: str = "w") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:16]}"

    def invoke(
        self,
        process: str,
        f: str,
        region: str,
        dataset: str,
        key: str = "",
        op_id: str | None = None,
        **value: object,
    ) -> Event:
        with self._lock:
            oid = op_id or self.new_id(f[0])
            if oid in self._open:
                raise ValueError(f"operation {oid} is already open in the history")
            event = Event(
                next(self._counter),
                time.monotonic_ns(),
                process,
                "invoke",
                f,
                oid,
                region,
                dataset,
                key,
                value,
            )
            self._events.append(event)
            self._open[oid] = event
            return event

    def complete(self, invoke: Event, outcome: EventType, **value: object) -> Event:
        if outcome not in COMPLETIONS:
            raise ValueError(f"a completion is ok, fail or info, not {outcome!r}")
        with self._lock:
            if self._open.pop(invoke.op_id, None) is None:
                raise ValueError(f"operation {invoke.op_id} is not open (completed twice?)")
            event = Event(
                next(self._counter),
                time.monotonic_ns(),
                invoke.process,
                outcome,
                invoke.f,
                invoke.op_id,
                invoke.region,
                invoke.dataset,
                invoke.key,
                value,
            )
            self._events.append(event)
            return event

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def operations(self) -> list[Operation]:
        return pair(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = (json.dumps(e.as_json(), sort_keys=True) for e in self.events)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> History:
        events = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                events.append(Event.from_json(json.loads(line), where=f"{path}:{n}"))
        return cls(events)


def pair(events: Iterable[Event]) -> list[Operation]:
    """Operations in invoke order, each with its completion if it had one."""
    invokes: dict[str, Event] = {}
    done: dict[str, Event] = {}
    order: list[str] = []
    for e in events:
        if e.type == "invoke":
            invokes[e.op_id] = e
            order.append(e.op_id)
        elif e.op_id in invokes and e.op_id not in done:
            done[e.op_id] = e
    return [Operation(invokes[i], done.get(i)) for i in order]
