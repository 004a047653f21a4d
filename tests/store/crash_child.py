"""Child process of the crash tests: open a store, then SIGKILL itself at one step of
the write protocol of a new version of `ds/k` (test scaffolding, run as a script).

    python crash_child.py ROOT STEP

Steps: `stream` (half-way through the bytes), `before-rename` (temporary file
fsynced), `after-rename`, `after-dir-fsync`, `in-commit` (inside the SQLite
transaction, its old version pruned, before COMMIT), `after-commit` (before the pruned files go),
`restore-after-rename` (refilling a missing version, before its commit),
`bundle-after-rename` (a put_many of three, after the second rename),
`apply-bundle-after-rename` / `apply-bundle-after-syncfs` (an apply_many of
`APPLY_BUNDLE` objects just too large to keep inline, closed unsynced: after its
second rename / after its one syncfs, before its rows commit), `apply-inline-in-commit`
(an apply_many of `APPLY_BUNDLE` small objects, kept inline: inside its transaction,
its version and blob rows written, before COMMIT).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from agents.store import files, rows
from agents.store.store import INLINE_MAX_BYTES, ObjectStore
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version

NEW = b"new version " * 100_000  # 1.2 MB: more than one chunk
RESTORE = b"restored bytes"
APPLY_BUNDLE = 40  # at least SYNCFS_MIN_FILES: the bundle is made durable by one syncfs


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, step: str) -> None:
    store = ObjectStore(root, clock=HybridClock("eu-west"), keep_versions=1)
    real_replace, real_fsync_dir = files.replace, files.fsync_dir
    real_journal_many = rows.journal_many
    real_syncfs = files.syncfs
    renamed = False

    renames = 0

    def replace(src: Path, dst: Path) -> None:
        nonlocal renamed, renames
        if step == "before-rename":
            die()
        real_replace(src, dst)
        renamed, renames = True, renames + 1
        if step in ("after-rename", "restore-after-rename") or (
            step in ("bundle-after-rename", "apply-bundle-after-rename") and renames == 2
        ):
            die()

    def syncfs(path: Path) -> None:
        real_syncfs(path)
        if step == "apply-bundle-after-syncfs":
            die()

    def fsync_dir(path: Path) -> None:
        real_fsync_dir(path)
        if step == "after-dir-fsync" and renamed:
            die()

    def journal_many(conn: object, entries: list[rows.JournalRow]) -> None:
        real_journal_many(conn, entries)  # type: ignore[arg-type]
        # `in-commit`: once the old version's removal is journalled (the pruning).
        pruning = any(kind == "removed" for kind, *_ in entries)
        if step == "apply-inline-in-commit" or (step == "in-commit" and pruning):
            die()

    def remove_file(path: Path) -> None:
        if step == "after-commit" and "objects" in path.parts:
            die()
        os.unlink(path)

    files.replace, files.fsync_dir = replace, fsync_dir
    rows.journal_many = journal_many
    files.syncfs = syncfs
    files.remove_file = remove_file

    def stream() -> Iterator[bytes]:
        yield NEW[: len(NEW) // 2]
        if step == "stream":
            die()
        yield NEW[len(NEW) // 2 :]

    if step == "bundle-after-rename":
        store.put_many([("ds", "k", stream()), ("ds", "k2", [b"second"]), ("ds", "k3", [b"3"])])
    elif step.startswith(("apply-bundle-", "apply-inline-")):
        items = []
        for n in range(APPLY_BUNDLE):
            data = f"applied {n}".encode()
            if step.startswith("apply-bundle-"):
                data = data.ljust(INLINE_MAX_BYTES + 1, b".")
            hlc = HLC(1_796_000_000_000, n, "us-east")
            items.append(("ds", f"b{n}", Version.put(hlc, len(data), Digest.of(data)), [data]))
        store.apply_many(items)
    elif step == "restore-after-rename":
        hlc = HLC.parse(sys.argv[3])
        store.apply("ds", "lost", Version.put(hlc, len(RESTORE), Digest.of(RESTORE)), [RESTORE])
    else:
        store.put("ds", "k", stream())
    print("finished without being killed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
