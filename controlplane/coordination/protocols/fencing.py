"""Fencing: a resource that refuses writes carrying a stale epoch.

Agents and the replicator put a `FencedResource` in front of every critical
write. It remembers the highest epoch it has seen per dataset and:

* accepts a write whose epoch is that one or newer (a newer one is remembered);
* rejects an older one with `StaleEpochError` (a non-retriable `FencedError`):
  the writer lost ownership while it was not looking (paused, partitioned) and
  must step down;
* while the dataset is *handing over*, rejects every write with
  `DatasetHandingOverError` (retriable): ownership is about to move. The one
  exception is the caller's to make (`admit(through_handover=True)`): an agent of
  the handover's target takes the owner's copies at its epoch
  (agents/admission.py).

Why the epoch and not the lease: a paused process cannot know its lease expired
until it runs again, and by then it may already be inside a write. Only the
resource, which has seen the newer epoch, can refuse it.

The epoch memory is pluggable: `MemoryEpochs` for one process, `DirectoryEpochs`
for several processes sharing a folder (one file per dataset, updated under an
exclusive `flock`, so check-and-remember is atomic across processes).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from controlplane.errors import FencedError, HandingOverError


class StaleEpochError(FencedError):
    """A write carried an epoch older than the newest the resource has seen."""


class DatasetHandingOverError(HandingOverError):
    """A write reached a dataset that is being handed over; retry after the move."""


class EpochMemory(Protocol):
    """Per-dataset record `{"epoch": int, "handing_over": bool, "revision": int}` (the
    etcd revision the handover state is as of) with atomic update."""

    def update(
        self, dataset: str, fn: Callable[[dict[str, object]], dict[str, object]]
    ) -> dict[str, object]:
        """Apply `fn` to the record atomically and return the stored result."""


class MemoryEpochs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, object]] = {}

    def update(
        self, dataset: str, fn: Callable[[dict[str, object]], dict[str, object]]
    ) -> dict[str, object]:
        with self._lock:
            rec = fn(dict(self._records.get(dataset, {})))
            self._records[dataset] = rec
            return dict(rec)


class DirectoryEpochs:
    """Epoch records shared by processes through files in `root`; also keeps a write log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, dataset: str) -> Path:
        return self.root / (dataset.replace("/", "%2F") + ".epoch")

    @contextmanager
    def _locked(self, dataset: str) -> Iterator[None]:
        # The lock lives in a file of its own: the record itself is replaced by rename.
        fd = os.open(self._path(dataset).with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def update(
        self, dataset: str, fn: Callable[[dict[str, object]], dict[str, object]]
    ) -> dict[str, object]:
        path = self._path(dataset)
        with self._locked(dataset):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                raw = b""
            old: dict[str, object] = json.loads(raw) if raw else {}
            rec = fn(dict(old))
            if rec != old:
                # A new file renamed into place, fsynced first: a crash leaves the old
                # record or the new one, never an empty or torn one (read as epoch 0,
                # that would admit stale writers).
                tmp = path.with_suffix(".tmp")
                with open(tmp, "wb") as fh:
                    fh.write(json.dumps(rec).encode())
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            return rec

    def append_log(self, line: dict[str, object]) -> None:
        """Append one JSON line to `writes.log` (atomic for lines under PIPE_BUF)."""
        with open(self.root / "writes.log", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def read_log(self) -> list[dict[str, object]]:
        path = self.root / "writes.log"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _epoch_of(rec: dict[str, object]) -> int:
    value = rec.get("epoch", 0)
    return value if isinstance(value, int) else 0


def _revision_of(rec: dict[str, object]) -> int:
    """The etcd revision the record's handover state was last learnt at (0: unknown)."""
    value = rec.get("revision", 0)
    return value if isinstance(value, int) else 0


class FencedResource:
    """Guards writes to datasets by epoch (see the module docstring for the rules)."""

    def __init__(self, memory: EpochMemory | None = None) -> None:
        self.memory: EpochMemory = memory if memory is not None else MemoryEpochs()

    def highest_epoch(self, dataset: str) -> int:
        return _epoch_of(self.memory.update(dataset, lambda r: r))

    def observe(
        self,
        dataset: str,
        epoch: int,
        *,
        handing_over: bool | None = None,
        revision: int | None = None,
    ) -> int:
        """Learn of an epoch (from an ownership watch); never lowers it. Returns the highest.

        `handing_over` is what the caller knows of a handover mark at that epoch;
        None (an owner event, which says nothing about marks) keeps what is known at
        an equal epoch, so a late owner event cannot lift a freeze that a mark set.
        `revision`: the etcd revision that knowledge is as of. At an equal epoch, news
        older than what the fence already learnt is ignored, whichever order the
        watch and the reads that tell it deliver theirs in (a read begun before a
        handover was marked, ending after the watch froze the fence, must not lift
        the freeze; nor a lagging watch's older event undo a newer read's).
        """

        def fn(rec: dict[str, object]) -> dict[str, object]:
            current, seen = _epoch_of(rec), _revision_of(rec)
            told = revision if revision is not None and handing_over is not None else 0
            if epoch > current:
                # An epoch is the revision of its owner write: whatever is learnt at it
                # is as of that revision at least, and anything known of older epochs
                # is older still.
                return {
                    "epoch": epoch,
                    "handing_over": bool(handing_over),
                    "revision": max(epoch, told),
                }
            if epoch == current and handing_over is not None:
                if revision is not None and revision < seen:
                    return rec  # older than what is known: not news
                return {"epoch": epoch, "handing_over": handing_over, "revision": max(seen, told)}
            return rec

        return _epoch_of(self.memory.update(dataset, fn))

    def admit(
        self,
        dataset: str,
        epoch: int,
        on_verdict: Callable[[bool], None] | None = None,
        *,
        through_handover: bool = False,
    ) -> int:
        """Check a write's epoch and remember it; raises instead of admitting a stale one.

        `on_verdict(accepted)` runs inside the atomic update, so what it records is
        ordered exactly as the decisions were taken. `through_handover`: the caller
        knows this write may pass a handover at its epoch (the handover's target
        taking the owner's catch-up); the freeze stays marked for every other write.
        """
        verdict: dict[str, object] = {}

        def fn(rec: dict[str, object]) -> dict[str, object]:
            current = _epoch_of(rec)
            if epoch < current:
                verdict["stale"] = current
                out = rec
            elif epoch == current and rec.get("handing_over"):
                if not through_handover:
                    verdict["handing_over"] = True
                out = rec
            else:
                # A newer epoch learnt from a write: no handover known at it, as of
                # its own owner write (an epoch is that write's revision).
                revision = epoch if epoch > current else _revision_of(rec)
                out = {"epoch": epoch, "handing_over": False, "revision": revision}
            if on_verdict is not None:
                on_verdict(not verdict)
            return out

        self.memory.update(dataset, fn)
        if "stale" in verdict:
            raise StaleEpochError(
                f"write to {dataset} carried epoch {epoch}, older than epoch "
                f"{verdict['stale']} already seen; this writer lost ownership and must step down"
            )
        if "handing_over" in verdict:
            raise DatasetHandingOverError(
                f"{dataset} is being handed over to another region; retry once ownership has moved"
            )
        return epoch

    def write(self, dataset: str, epoch: int, payload: dict[str, object], writer: str) -> None:
        """Admit a write, recording the verdict in the write log of `DirectoryEpochs`."""
        self.admit(
            dataset, epoch, lambda ok: self._log(dataset, epoch, writer, payload, accepted=ok)
        )

    def _log(
        self, dataset: str, epoch: int, writer: str, payload: dict[str, object], *, accepted: bool
    ) -> None:
        if isinstance(self.memory, DirectoryEpochs):
            self.memory.append_log(
                {
                    "dataset": dataset,
                    "epoch": epoch,
                    "writer": writer,
                    "accepted": accepted,
                    "t": time.time(),
                    **payload,
                }
            )
