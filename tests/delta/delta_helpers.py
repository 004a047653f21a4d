"""Shared helpers of the delta tests: round trips through the Python front."""

from __future__ import annotations

from pathlib import Path

import native


def round_trip(
    folder: Path, old: bytes, new: bytes, *, threads: int = 1, block_size: int | None = None
) -> bytes:
    """Signs OLD, diffs NEW, patches, checks the result and returns the delta bytes."""
    (folder / "old").write_bytes(old)
    (folder / "new").write_bytes(new)
    native.signature(folder / "old", folder / "sig", threads=threads, block_size=block_size)
    native.delta(folder / "sig", folder / "new", folder / "delta", threads=threads)
    native.patch(folder / "old", folder / "delta", folder / "out", threads=threads)
    assert (folder / "out").read_bytes() == new
    return (folder / "delta").read_bytes()


def listing(folder: Path) -> set[str]:
    """Every name in the folder, hidden temporaries included."""
    return {p.name for p in folder.iterdir()}
