"""The replicator's own durable record journal: how records survive a catalog outage.

The data path never waits for the catalog (dataplane.md, *Records*). What the
replicator learns about a replica (an attempt failed and will be retried: `pending`
with its error; `failed` after `max_attempts`; `completed`) and every copy it
refuses for residency is appended here, in a local SQLite file, BEFORE the event's
Kafka offset is committed. WAL with synchronous=NORMAL: a commit survives a crash or
SIGKILL of the process (it is in the file); only a power loss may take the last
rows, and then the replica merely shows as missing, which counts as pending in the
lag and is re-driven by `replication resync`. `RecordShipper`
(shipper.py) ships the rows to the catalog in order and deletes them once the
catalog has them; every catalog write it makes is idempotent, so a crash between
shipping and deleting only repeats a no-op.

Completed copies are also recorded by the agent itself (its journal, in the same
transaction as the data, shipped by the agent's recorder); the replicator's
`completed` row only moves the same replica to the same state, which the catalog
treats as a no-op, so whichever arrives first wins and the other changes nothing.
So a version the agent answers APPLIED in a batch call (`apply_many`, whose
commit holds those journal rows) gets no row here at all: it would be a journal
row and a catalog write per event that change nothing. A late `pending` of ours
after the agent's `completed` is refused by the catalog (shipper.py), so the
agent's record alone keeps the replica complete.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from controlplane.errors import ConfigError

RecordKind = Literal["replica", "refused"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class ReplicaRecord:
    """One fact about the copy of one version in one region.

    `kind` "replica": the replica moves to `state` (`pending` after a failed attempt,
    `failed` after the last one, `completed` once held), `error` and `attempted`
    describing the attempt. "refused": the copy was refused for residency (recorded
    as a refused transfer `refused:<event_id>:<region>`, no replica)."""

    kind: RecordKind
    event_id: str
    dataset: str
    key: str
    hlc: str  # the version's HLC text, which names the version
    op: str
    size: int
    digest: str  # "" for a tombstone
    origin_region: str
    set_id: str | None
    region: str
    state: str
    at: datetime
    attempted: bool = False
    error: str | None = None
    policy_revision: int | None = None

    def to_json(self) -> str:
        # A shallow copy of the instance's fields (in field order), not
        # dataclasses.asdict: that deep-copies every value, and this runs once per event
        # applied (so does the one shared encoder).
        data = dict(self.__dict__)
        data["at"] = self.at.isoformat()
        return _ENCODE(data)

    @classmethod
    def from_json(cls, text: str) -> ReplicaRecord:
        data = json.loads(text)
        data["at"] = datetime.fromisoformat(data["at"])
        return cls(**data)


# `json.dumps` with separators builds a new encoder at every call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(frozen=True)
class JournalRow:
    seq: int
    record: ReplicaRecord


class RecordJournal:
    """The journal file; thread-safe.

    `append` buffers a row in memory; `flush` writes every buffered row in one
    transaction (the consume loop calls it before each offset commit, so a row is in
    the file before the offset of its event is committed, at one write per commit
    rather than one per event). Reads (`pending`, `count`) flush first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the replicator's journal {path}: {exc}") from exc
        self._lock = threading.Lock()
        self._buffer: list[tuple[str, str]] = []

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._db.close()

    def append(self, record: ReplicaRecord) -> None:
        row = (record.kind, record.to_json())
        with self._lock:
            self._buffer.append(row)

    def append_many(self, records: Sequence[ReplicaRecord]) -> None:
        """`append` for a batch: one lock, one extend."""
        rows = [(r.kind, r.to_json()) for r in records]
        with self._lock:
            self._buffer.extend(rows)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def flush(self) -> None:
        """Write the buffered rows (one transaction); durable against a process crash."""
        with self._lock:
            rows, self._buffer = self._buffer, []
            if not rows:
                return
            try:
                self._db.execute("BEGIN")
                self._db.executemany("INSERT INTO records (kind, data) VALUES (?, ?)", rows)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._buffer = rows + self._buffer  # kept for the next flush
                raise

    def pending(self, limit: int = 200) -> list[JournalRow]:
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, data FROM records ORDER BY seq LIMIT ?", (limit,)
            ).fetchall()
        return [JournalRow(seq, ReplicaRecord.from_json(data)) for seq, data in rows]

    def shipped(self, seqs: list[int]) -> None:
        if not seqs:
            return
        with self._lock:
            self._db.executemany("DELETE FROM records WHERE seq = ?", [(s,) for s in seqs])

    def count(self) -> int:
        self.flush()
        with self._lock:
            (n,) = self._db.execute("SELECT count(*) FROM records").fetchone()
        return int(n)
