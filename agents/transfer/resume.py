"""What a receiver keeps of a cut Sync, so that the next attempt continues instead of
starting over: under `ROOT/transfers/`, per wanted version, a state file (JSON,
replaced atomically) and a partial file it describes.

- method "raw" (no basis): the partial file IS the partial content, and `offset`
  counts its durable bytes; the next attempt hashes them again and appends.
- methods "basis" and "signature": the partial file is the delta received so far
  (teed to disk while the engine patches it as it arrives: the engine cannot start a
  patch in the middle of a delta, whose END frame checks the digest of the whole
  output), and `offset` counts its durable bytes; the next attempt patches from that
  prefix and then from the network, and the sender skips what the prefix holds.

`offset` only ever names bytes that were fsynced before the state file said so (a
checkpoint every `CHECKPOINT_BYTES`), so a SIGKILL at any point leaves a state that is
true. States older than `MAX_AGE_S` are removed at start and then periodically (the
daemon's `ResumeSweeper`, sweep.py): the sender may no longer hold the version or its
basis by then. A sweep spares the states of pulls in flight (`in_flight`): a first
attempt writes its partial file before its first state, and a long one outlives
MAX_AGE_S.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from blake3 import blake3

from agents.store import files
from controlplane.logs import get_logger

log = get_logger(__name__)

FOLDER = "transfers"
CHECKPOINT_BYTES = 16 << 20
MAX_AGE_S = 24 * 3600


@dataclass
class ResumeState:
    transfer_id: str
    dataset: str
    key: str
    hlc: str
    method: str
    basis_hlc: str  # empty for raw
    offset: int  # durable bytes of the partial file
    received: int  # bytes the attempts received in all (offset plus what may be lost)
    created_s: float


class ResumeBook:
    """The resume states of one store root."""

    def __init__(self, root: Path) -> None:
        self.folder = root / FOLDER
        self.folder.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}  # name -> pulls in flight (a sweep spares them)

    def _name(self, dataset: str, key: str, hlc: str) -> str:
        return blake3(f"{dataset}\0{key}\0{hlc}".encode()).hexdigest()[:40]

    @contextlib.contextmanager
    def in_flight(self, dataset: str, key: str, hlc: str) -> Iterator[None]:
        """Mark a pull of this version as running: `expire` leaves its files alone."""
        name = self._name(dataset, key, hlc)
        with self._lock:
            self._busy[name] = self._busy.get(name, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy.pop(name) - 1
                if left:
                    self._busy[name] = left

    def partial_path(self, dataset: str, key: str, hlc: str) -> Path:
        return self.folder / f"{self._name(dataset, key, hlc)}.part"

    def output_path(self, dataset: str, key: str, hlc: str) -> Path:
        """Where a delta's patch output goes (made whole by the engine, then committed)."""
        return self.folder / f"{self._name(dataset, key, hlc)}.out"

    def _state_path(self, dataset: str, key: str, hlc: str) -> Path:
        return self.folder / f"{self._name(dataset, key, hlc)}.json"

    def load(self, dataset: str, key: str, hlc: str) -> ResumeState | None:
        path = self._state_path(dataset, key, hlc)
        try:
            state = ResumeState(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, OSError) as err:
            log.warning("resume state unreadable; starting over", path=str(path), error=str(err))
            self.drop(dataset, key, hlc)
            return None
        if (state.dataset, state.key, state.hlc) != (dataset, key, hlc):
            self.drop(dataset, key, hlc)
            return None
        return state

    def save(self, state: ResumeState) -> None:
        """Replace the state file atomically (after the partial bytes it names are fsynced)."""
        path = self._state_path(state.dataset, state.key, state.hlc)
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w") as out:
            json.dump(asdict(state), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        files.fsync_dir(self.folder)

    def drop(self, dataset: str, key: str, hlc: str) -> None:
        for path in (
            self._state_path(dataset, key, hlc),
            self.partial_path(dataset, key, hlc),
            self.output_path(dataset, key, hlc),
        ):
            files.remove_file(path)

    def drop_evicted(self, dataset: str, evicted: Mapping[str, str]) -> int:
        """Remove the states (and their files) of `dataset`'s pulls of a key in `evicted`
        (key -> HLC text) at that version or older, except pulls in flight: the partial
        bytes of copies `meridian dataset evict` made this region forget, which would
        otherwise stay on its disk until they expire. Returns how many states went."""
        doomed = [
            (stem, state)
            for stem, state in self._states()
            if state is not None and _forgotten(state, dataset, evicted)
        ]
        # Under the lock: a pull of one of them that begins meanwhile waits for its files
        # to be gone, then starts afresh.
        with self._lock:
            doomed = [(stem, state) for stem, state in doomed if stem not in self._busy]
            for _, state in doomed:
                self.drop(state.dataset, state.key, state.hlc)
        return len(doomed)

    def _states(self) -> Iterator[tuple[str, ResumeState | None]]:
        """Each state file's name (without `.json`) and its state (None: unreadable)."""
        for entry in os.scandir(self.folder):
            if not entry.name.endswith(".json"):
                continue
            try:
                state: ResumeState | None = ResumeState(**json.loads(Path(entry.path).read_text()))
            except (ValueError, TypeError, OSError):
                state = None
            yield entry.name[: -len(".json")], state

    def expire(
        self, now_s: float | None = None, *, max_age_s: float = MAX_AGE_S, limit: int | None = None
    ) -> int:
        """Remove states (and their files) older than `max_age_s`, and any file without a
        state, except those of pulls in flight; at most `limit` states per call (a
        periodic sweep stays bounded; the next one takes the rest). Returns how many
        states went."""
        now_s = time.time() if now_s is None else now_s
        removed = 0
        keep: set[str] = set()
        doomed: set[str] = set()
        for stem, state in self._states():
            try:
                fresh = state is not None and now_s - state.created_s < max_age_s
            except TypeError:  # a state file of the wrong shape
                fresh = False
            if fresh or (limit is not None and removed >= limit):
                keep.add(stem)
            else:
                doomed.add(stem)
                removed += 1
        with self._lock:
            busy = set(self._busy)
        removed -= len(doomed & busy)
        for entry in os.scandir(self.folder):
            # A pull's files are named after its state's stem, the delta engine's output
            # as it patches `.<stem>.out.<random>.tmp` (a dot first: not `""`'s).
            stem = entry.name.lstrip(".").split(".", 1)[0]
            if stem not in keep and stem not in busy:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        return removed


def _forgotten(state: ResumeState, dataset: str, evicted: Mapping[str, str]) -> bool:
    """Whether `state` is a pull of a version of `dataset` an eviction forgot."""
    try:
        at = evicted.get(state.key)
        return state.dataset == dataset and at is not None and state.hlc <= at
    except TypeError:  # a state file of the wrong shape: `expire` removes it
        return False


class Checkpointer:
    """Checkpoints of one attempt, each on a worker thread so that the fsync does not
    stall the bytes arriving (at most one in flight; a due one waits for the next
    chunk). `sync()` makes the partial file durable and returns the length it covers."""

    def __init__(self, book: ResumeBook, state: ResumeState, every_bytes: int) -> None:
        self.book, self.state, self.every = book, state, every_bytes
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="meridian-xfer-ckpt")
        self._pending: Future[None] | None = None
        self._mark = state.offset

    def maybe(self, size: int, sync: Callable[[], int]) -> None:
        if size - self._mark < self.every:
            return
        if self._pending is not None and not self._pending.done():
            return
        self._mark = size
        self._pending = self._pool.submit(self._save, sync)

    def _save(self, sync: Callable[[], int]) -> None:
        offset = sync()
        if offset > self.state.offset:
            self.state.offset = offset
            self.book.save(self.state)

    def finish(self, sync: Callable[[], int] | None = None) -> None:
        """Wait for the checkpoint in flight; with `sync`, take a last one (a cut)."""
        try:
            if self._pending is not None:
                with contextlib.suppress(Exception):
                    self._pending.result()
            if sync is not None:
                self._save(sync)
        finally:
            self._pool.shutdown(wait=True)
