"""`meridian delta patch` without typer (controlplane/cli/delta_fast.py): the plain
command lines it takes print, write and fail exactly as the typer command does, it
does not load typer, and every other command line is left to typer untouched."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import native
from controlplane.cli import delta_fast

OLD = random.Random(7).randbytes(300_000)
NEW = OLD[:100_000] + b"something new" + OLD[100_000:290_000]

# the console script's way in, and typer's (controlplane.cli.main.run) for the same argv
FAST = "import sys; from controlplane.cli.entry import entry; sys.argv[0] = 'meridian'; entry()"
TYPER = "import sys; from controlplane.cli.main import run; sys.exit(run(sys.argv[1:]))"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "old").write_bytes(OLD)
    (tmp_path / "new").write_bytes(NEW)
    (tmp_path / "other").write_bytes(NEW)
    native.delta_basis(tmp_path / "old", tmp_path / "new", tmp_path / "delta", dtype="fp32")
    return tmp_path


def _cli(
    code: str, argv: list[str], stdin: bytes = b"", cwd: Path | None = None
) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


@pytest.mark.parametrize(
    ("extra", "old", "from_stdin"),
    [
        ([], "old", False),
        (["-j", "2", "--max-output-size", str(len(NEW))], "old", False),
        (["--threads=1", "--output", "json"], "old", False),
        (["--max-output-size", "1000"], "old", False),  # over the cap
        ([], "other", False),  # the wrong basis
        ([], "old", True),  # the delta on standard input
    ],
    ids=["plain", "options", "equals-json", "cap", "wrong-basis", "stdin"],
)
def test_the_fast_path_does_what_typer_does(
    files: Path, extra: list[str], old: str, from_stdin: bool
) -> None:
    delta = files / "delta"
    stdin = delta.read_bytes() if from_stdin else b""
    results = []
    for code, out in ((FAST, files / "out_fast"), (TYPER, files / "out_typer")):
        argv = ["delta", "patch", str(files / old), "-" if from_stdin else str(delta), str(out)]
        status, stdout, stderr = _cli(code, argv + extra, stdin)
        written = out.read_bytes() if out.exists() else None
        results.append((status, stdout, stderr.replace(out.name, "OUT"), written))
    assert results[0] == results[1]
    status, stdout, stderr, written = results[0]
    if status == 0:
        assert written == NEW and json.loads(stdout)[0]["input_bytes"] == len(delta.read_bytes())
    else:
        assert written is None and stdout == "" and stderr.startswith("error: ")


def test_the_fast_path_does_not_load_typer(files: Path) -> None:
    probe = (
        "import json, sys\nfrom controlplane.cli import delta_fast\n"
        "status = delta_fast.run(sys.argv[1:])\n"
        "print(json.dumps([status, 'typer' in sys.modules, 'click' in sys.modules]))"
    )
    argv = [str(files / "old"), str(files / "delta"), str(files / "out")]
    status, stdout, _ = _cli(probe, argv)
    assert status == 0
    assert json.loads(stdout.strip().splitlines()[-1]) == [0, False, False]
    assert (files / "out").read_bytes() == NEW


@pytest.mark.parametrize(
    "argv",
    [
        ["old", "delta"],  # a path missing: typer's usage error
        ["old", "delta", "out", "extra"],
        ["old", "delta", "out", "--help"],
        ["old", "delta", "out", "--debug"],
        ["old", "delta", "out", "-o", "table"],
        ["old", "delta", "out", "--output", "csv"],
        ["old", "delta", "out", "-j3"],
        ["old", "delta", "out", "-j", "+3"],
        ["old", "delta", "out", "-j", "9"],  # typer's own refusal and wording
        ["old", "delta", "out", "--max-output-size", "-1"],
        ["old", "delta", "out", "--max-output-size"],
        ["old", "delta", "out", "-j", "1", "-j", "2"],
        ["old", "delta", "out", "-o=json"],
        ["old", "delta", "out", "--"],
        ["old", "-x", "delta", "out"],
    ],
)
def test_anything_else_is_left_to_typer(files: Path, argv: list[str]) -> None:
    """None (typer runs it) and nothing written, for every command line it does not take."""
    paths = {"old": str(files / "old"), "delta": str(files / "delta"), "out": str(files / "out")}
    assert delta_fast.run([paths.get(a, a) for a in argv]) is None
    assert not (files / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["./missing", "./delta", "./out"],  # named in the error as typer names it
        ["./old", "./-", "./out"],  # `./-` is standard input to typer too
        ["old/", "delta", "out"],
        ["", "delta", "out"],  # typer reads "" as the current folder
    ],
    ids=["dot-slash", "dot-slash-dash", "trailing-slash", "empty"],
)
def test_paths_are_read_as_typer_reads_them(files: Path, argv: list[str]) -> None:
    stdin = (files / "delta").read_bytes()
    results = []
    for code in (FAST, TYPER):
        (files / "out").unlink(missing_ok=True)
        status, stdout, stderr = _cli(code, ["delta", "patch", *argv], stdin, cwd=files)
        out = files / "out"
        results.append((status, stdout, stderr, out.read_bytes() if out.exists() else None))
    assert results[0] == results[1]
    if argv[1] == "./-":
        assert results[0][0] == 0 and results[0][3] == NEW
