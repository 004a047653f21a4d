"""A round trip of a sparse file over 4 GiB: 64-bit offsets and lengths end to end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import native

SIZE = (4 << 30) + 1_012_345


def _sparse(path: Path, writes: dict[int, bytes]) -> None:
    with path.open("wb") as f:
        f.truncate(SIZE)
        for off, data in writes.items():
            f.seek(off)
            f.write(data)


def _same(a: Path, b: Path) -> bool:
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            x, y = fa.read(16 << 20), fb.read(16 << 20)
            if x != y:
                return False
            if not x:
                return True


@pytest.mark.slow
def test_sparse_file_over_4gib_round_trips(tmp_path: Path) -> None:
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    marks = {0: b"start", 3 << 30: b"three", (4 << 30) + 100: b"beyond 4 GiB", SIZE - 7: b"the end"}
    _sparse(old, marks)
    _sparse(new, {**marks, (4 << 30) + 5000: os.urandom(70_000), 1 << 20: b"early change"})
    threads = min(os.cpu_count() or 1, 4)
    native.signature(old, tmp_path / "sig", threads=threads)
    stats = native.delta(tmp_path / "sig", new, tmp_path / "delta", threads=threads)
    assert stats.input_bytes == SIZE
    assert (tmp_path / "delta").stat().st_size < 1 << 20
    native.patch(old, tmp_path / "delta", out, threads=threads)
    assert out.stat().st_size == SIZE
    # zeros were written as holes, so the round trip costs no 4 GiB of disk
    assert out.stat().st_blocks * 512 < 64 << 20
    assert _same(out, new)
