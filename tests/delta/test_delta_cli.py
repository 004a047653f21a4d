"""`meridian delta signature|diff|patch`: round trip, and bad input gives one
sentence on stderr, exit status 1 and no output file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from delta_helpers import listing

from controlplane.cli.main import run

OLD = random.Random(99).randbytes(700_000)
NEW = OLD[:300_000] + b"an insertion" + OLD[300_000:650_000] + b"appended"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "old").write_bytes(OLD)
    (tmp_path / "new").write_bytes(NEW)
    return tmp_path


def _meridian(*args: str | Path) -> int:
    return run(["delta", *[str(a) for a in args]])


def test_round_trip(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _meridian("signature", files / "old", files / "sig", "--block-size", "2048") == 0
    assert _meridian("diff", files / "sig", files / "new", files / "delta", "--threads", "3") == 0
    report = json.loads(capsys.readouterr().out.split("\n]\n")[1] + "\n]")
    assert report[0]["input_bytes"] == len(NEW)
    assert report[0]["literal_bytes"] < 3 * 2048 + 100
    assert _meridian("patch", files / "old", files / "delta", files / "out", "-j", "1") == 0
    assert (files / "out").read_bytes() == NEW


def _one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and lines[0].endswith(".")
    return lines[0]


def _delta(files: Path) -> bytes:
    assert _meridian("signature", files / "old", files / "sig") == 0
    assert _meridian("diff", files / "sig", files / "new", files / "delta") == 0
    return (files / "delta").read_bytes()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[: len(d) // 2], "the delta is truncated"),
        (lambda d: d[:100] + bytes([d[100] ^ 4]) + d[101:], "the delta is corrupt"),
        (lambda d: d[:-40] + bytes([d[-40] ^ 1]) + d[-39:], "the delta is corrupt"),
        (
            lambda d: b"not a delta at all, but long enough to hold a header" * 2,
            "not a Meridian delta",
        ),
    ],
    ids=["truncated", "corrupt-frame", "corrupt-end", "not-a-delta"],
)
def test_bad_delta_exits_1_and_leaves_no_output(
    files: Path, capsys: pytest.CaptureFixture[str], damage: object, message: str
) -> None:
    delta = _delta(files)
    (files / "bad").write_bytes(damage(delta))  # type: ignore[operator]
    before = listing(files)
    capsys.readouterr()
    assert _meridian("patch", files / "old", files / "bad", files / "out") == 1
    line = _one_sentence(capsys.readouterr().err)
    assert message in line and "bad" in line
    assert listing(files) == before


def test_wrong_basis_exits_1(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _delta(files)
    before = listing(files)
    capsys.readouterr()
    assert _meridian("patch", files / "new", files / "delta", files / "out") == 1
    assert "OLD is not the file this delta was made against" in _one_sentence(
        capsys.readouterr().err
    )
    assert listing(files) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["signature", "{d}/missing", "{d}/sig"], "does not exist"),
        (["signature", "{d}/old", "{d}/sig", "--block-size", "12"], "--block-size"),
        (["signature", "{d}/old", "{d}/sig", "--threads", "0"], "--threads"),
        (["diff", "{d}/old", "{d}/new", "{d}/delta"], "the signature is corrupt"),
        (["diff", "{d}/old", "{d}/new", "{d}/nofolder/delta"], "folder"),
    ],
    ids=["missing-input", "block-size", "threads", "not-a-signature", "no-folder"],
)
def test_bad_input_exits_1(
    files: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = listing(files)
    assert _meridian(*[a.format(d=files) for a in args]) == 1
    assert message in _one_sentence(capsys.readouterr().err)
    assert listing(files) == before


def test_output_that_is_an_input_or_a_device_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.bin"
    old.write_bytes(b"hello world" * 1000)
    sig = tmp_path / "old.sig"
    assert run(["delta", "signature", str(old), str(sig)]) == 0
    before = old.read_bytes()
    capsys.readouterr()
    assert run(["delta", "signature", str(old), str(old)]) == 1
    assert "same file as the OLD" in capsys.readouterr().err
    assert run(["delta", "diff", str(sig), str(old), str(sig)]) == 1
    assert "same file as the signature" in capsys.readouterr().err
    assert run(["delta", "signature", str(old), "/dev/null"]) == 1
    assert "not a regular file" in capsys.readouterr().err
    assert old.read_bytes() == before
    assert Path("/dev/null").is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.bin", "old.sig"]
