"""`meridian policy validate` refuses what is not a policy file without reading it.

A FIFO with no writer, /dev/urandom and /dev/zero would block or never end if
read; each CLI run here is a child process under a timeout (and a memory limit, so
a regression that reads /dev/zero fails fast instead of eating the machine).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness.cli_schema import check_output

from controlplane.cli.main import run
from controlplane.policy import loader
from controlplane.policy.loader import MAX_FILE_BYTES, load_file

DATA = Path(__file__).parent / "data"
EXAMPLE = DATA / "example.yaml"
TIMEOUT_S = 30
# The child: at most 1 GiB of address space, then the CLI as `meridian` runs it.
CHILD = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
    "from controlplane.cli.main import entry; sys.argv[0] = 'meridian'; entry()"
)


def validate_in_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, "policy", "validate", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def refused(name: str, what: str) -> str:
    return f"{name}:1:1: error: cannot read the file: it is {what}, not a regular file"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "policy.fifo"
    os.mkfifo(path)
    return path


def test_a_fifo_without_writer_is_refused_not_waited_for(fifo: Path) -> None:
    done = validate_in_child(str(fifo))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        refused(str(fifo), "a FIFO (named pipe)"),
        "error: 1 problem(s) in 1 file(s)",
    ]
    assert done.stdout == ""


@pytest.mark.parametrize("device", ["/dev/urandom", "/dev/zero"])
def test_a_device_is_refused_not_read(device: str) -> None:
    if not Path(device).exists():
        pytest.fail(f"{device} is missing on this machine")
    done = validate_in_child(device)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        refused(device, "a character device"),
        "error: 1 problem(s) in 1 file(s)",
    ]


def test_the_other_files_are_still_validated(fifo: Path, tmp_path: Path) -> None:
    """One refused file is one problem; the others are checked as always, in one run."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("priority: 100", "prioirty: 100"))
    done = validate_in_child("--output", "json", "/dev/urandom", str(bad))
    assert done.returncode == 1
    problems = json.loads(done.stdout)
    check_output("policy_validate", problems)
    assert [(p["file"], p["message"].split(";")[0]) for p in problems] == [
        ("/dev/urandom", "cannot read the file: it is a character device, not a regular file"),
        (str(bad), "unknown field 'prioirty' in spec"),
    ]


def test_a_file_over_16_mib_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no 16 MiB written to the disk
    assert run(["policy", "validate", str(big)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{big}:1:1: error: cannot read the file: it is 16.0 MiB, over the 16 MiB limit "
        "of a policy file",
        "error: 1 problem(s) in 1 file(s)",
    ]


def test_the_size_limit_is_inclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", 64)
    at_limit, over = tmp_path / "at.yaml", tmp_path / "over.yaml"
    at_limit.write_text("# x\n" * 16)  # 64 bytes: read, and an empty document
    over.write_text("# x\n" * 16 + "\n")
    assert load_file(at_limit) == ([], [])
    docs, problems = load_file(over)
    assert docs == []
    assert [p.message for p in problems] == [
        "cannot read the file: it is 0.0 MiB, over the 0 MiB limit of a policy file"
    ]


def test_a_file_that_grows_past_the_limit_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size stat gives is not trusted alone: at most MAX_FILE_BYTES + 1 are read."""
    path = tmp_path / "growing.yaml"
    path.write_text("# x\n" * 32)  # 128 bytes, while stat is made to say 10
    monkeypatch.setattr(loader, "MAX_FILE_BYTES", 64)
    monkeypatch.setattr(loader, "_mode_and_size", lambda st: (st.st_mode, 10))
    docs, problems = load_file(path)
    assert docs == []
    assert [p.message for p in problems] == [
        "cannot read the file: it is more than 0 MiB, over the 0 MiB limit of a policy file"
    ]


def test_a_socket_and_a_directory_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "policy.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert load_file(sock_path)[1][0].message.endswith("it is a socket, not a regular file")
    # The CLI refuses a directory before the loader sees it; other callers get this.
    assert load_file(tmp_path)[1][0].message.endswith("it is a directory, not a regular file")


@pytest.mark.timeout(TIMEOUT_S)
def test_plan_and_apply_refuse_a_fifo_and_change_nothing(
    fifo: Path, catalog_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["policy", "apply", "--catalog", catalog_url, "--yes", str(fifo)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        refused(str(fifo), "a FIFO (named pipe)"),
        "error: 1 problem(s) in 1 file(s); nothing was changed",
    ]
    # The catalog holds no revision: plan of the example still has everything to add.
    assert run(["policy", "plan", "--catalog", catalog_url, "-o", "json", str(EXAMPLE)]) == 2
    assert all(c["action"] == "add" for c in json.loads(capsys.readouterr().out))
