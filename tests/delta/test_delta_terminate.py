"""`meridian delta patch` stopped by SIGTERM or SIGHUP mid-write: it unwinds as Ctrl-C
does (exit 130) and leaves neither OUT nor its partial temporary file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import native

SIZE = 2 << 30  # sparse: a few seconds of reading and hashing, no disk
MERIDIAN = str(Path(sys.executable).parent / "meridian")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("terminate")
    for name, mark in (("old", b"old"), ("new", b"new")):
        with (root / name).open("wb") as f:
            f.truncate(SIZE)
            f.seek(SIZE // 2)
            f.write(mark)
    native.signature(root / "old", root / "sig", threads=2)
    native.delta(root / "sig", root / "new", root / "delta", threads=2)
    yield root


def _partials(folder: Path) -> list[Path]:
    return list(folder.glob(".out.*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
@pytest.mark.parametrize("output", ["json", "table"], ids=["fast-path", "typer"])
def test_a_signal_mid_patch_leaves_no_output(
    files: Path, tmp_path: Path, sig: signal.Signals, output: str
) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [MERIDIAN, "delta", "patch", str(files / "old"), str(files / "delta"), str(out),
         "-o", output, "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _partials(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # polls for the temporary file: the moment to signal
        assert _partials(tmp_path), "the patch ended (or never began) before it was signalled"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()
    assert "interrupted" in err.decode()
    assert not out.exists()
    assert _partials(tmp_path) == []


def test_a_cap_beyond_64_bits_is_refused_not_wrapped(files: Path, tmp_path: Path) -> None:
    from controlplane.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="--max-output-size must be from 0 to"):
        native.patch(files / "old", files / "delta", tmp_path / "out", max_output_size=1 << 64)
    assert not (tmp_path / "out").exists()
