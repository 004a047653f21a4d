"""Helpers of the agent store's tests: versions "made elsewhere", file listings."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from agents.store import ObjectStore
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Digest, Version

StoreFactory = Callable[..., ObjectStore]


def remote(
    data: bytes, *, ago_ms: int = 1000, logical: int = 0, region: str = "us-east"
) -> Version:
    """A put version made in another region `ago_ms` ago."""
    return Version.put(HLC(system_ms() - ago_ms, logical, region), len(data), Digest.of(data))


def tree(root: Path) -> list[str]:
    """Every file under `root`, relative, sorted."""
    return sorted(str(Path(d, f).relative_to(root)) for d, _, names in os.walk(root) for f in names)


def object_files(root: Path) -> list[str]:
    return [p for p in tree(root) if p.startswith("objects/")]


def refuse_journal_rows_of(root: Path, key: str) -> None:
    """Make the store's database refuse any journal row of `key` (a trigger beside the
    open store): a bundle naming it then fails at its commit."""
    conn = sqlite3.connect(root / "meta.db")
    # A trigger takes no parameters: the key (a test's own, no quote in it) goes in the text.
    conn.execute(
        f"CREATE TRIGGER refuse BEFORE INSERT ON journal WHEN NEW.key = '{key}'"
        " BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    conn.commit()
    conn.close()
