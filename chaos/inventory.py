"""The residency inventory of one agent's root: every copy, attributed to a dataset.

Reads the store's own metadata read-only (`meta.db`, table `versions`: each
stored file's dataset and key by its path; table `inline_bytes`: the small
versions kept in meta.db itself, each a copy with no file; see
agents/store/README.md) and walks every file under `objects/`, `tmp/` and
`transfers/`. A file no row names (a
write in progress, a partial transfer, a crash's leftover) is attributed by its
`user.meridian.dataset` extended attribute when the store set one, else left
unattributed (`dataset=None`), which the residency checker counts as the worst
dataset: bytes of unknown origin in a region are assumed to be forbidden ones.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from chaos.records import Copy, CopyKind

DATASET_XATTR = "user.meridian.dataset"
FOLDERS: dict[str, CopyKind] = {"objects": "object", "tmp": "tmp", "transfers": "tmp"}


def _rows(root: Path) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str, str]]]:
    """The stored files' (dataset, key) by path, and the inline versions' (dataset,
    key, hlc): small versions whose bytes live in meta.db itself, not in a file."""
    db = root / "meta.db"
    if not db.exists():
        return {}, []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT path, dataset, key FROM versions WHERE path IS NOT NULL")
        by_path = {str(p): (str(d), str(k)) for p, d, k in rows}
        has_inline = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'inline_bytes'"
        ).fetchone()
        inline = (
            [
                (str(d), str(k), str(h))
                for d, k, h in conn.execute("SELECT dataset, key, hlc FROM inline_bytes")
            ]
            if has_inline
            else []
        )
        return by_path, inline
    finally:
        conn.close()


def _xattr_dataset(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return os.getxattr(path, DATASET_XATTR).decode("utf-8", errors="replace")
    return None


def inventory_root(root: Path, region: str) -> list[Copy]:
    rows, inline = _rows(root)
    # Inline versions are copies too (agents/store/README.md): bytes held in meta.db.
    out = [
        Copy(region, dataset, key, "object", f"meta.db#inline/{dataset}/{key}@{hlc}")
        for dataset, key, hlc in inline
    ]
    for folder, kind in FOLDERS.items():
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            rel = str(path.relative_to(root))
            named = rows.get(rel) or rows.get(str(path))
            if named is not None:
                out.append(Copy(region, named[0], named[1], kind, rel))
            else:
                out.append(Copy(region, _xattr_dataset(path), "", kind, rel))
    return out
