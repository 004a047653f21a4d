"""Records set aside: journal records the catalog refused for good, outbox events that
cannot be encoded. They must not wedge the queue behind them, and must not vanish
either, so each is appended (and fsynced) to a JSON-lines file in the store root
before its queue moves past it: one line per record with the reason, for an
operator (or a later tool) to look at and re-ship. Retrying them would only repeat
the refusal: a record is set aside only for a non-retriable error.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from agents.store import files
from agents.store.model import JsonValue
from controlplane.logs import get_logger

log = get_logger("meridian.agent.records")


class SetAside:
    """An append-only, fsynced JSON-lines file (`path`); thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def keep(self, what: str, record: dict[str, JsonValue], reason: str) -> None:
        line = {"at_ms": time.time_ns() // 1_000_000, "what": what, "reason": reason}
        text = json.dumps({**line, "record": record}, sort_keys=True) + "\n"
        with self._lock:
            new = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                files.fsync_dir(self.path.parent)  # the file's name is durable too
        log.error("record_set_aside", what=what, reason=reason, file=str(self.path))

    def read(self) -> list[dict[str, JsonValue]]:
        """Every line kept so far, oldest first (empty when none)."""
        with self._lock:
            if not self.path.exists():
                return []
            lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]
