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


# A few hundred bytes of YAML can still be too much: nested aliases expand to billions
# of values, 3,000 brackets exhaust Python's stack. Each is one problem with a position,
# and the other files are still checked (in a child with 1 GiB, as above).

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefghij", "bcdefghijk", strict=True)
)  # 9 ** 11 values once expanded


def typo_file(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("priority: 100", "prioirty: 100"))
    return bad


def test_an_alias_bomb_is_one_problem_and_hides_no_other_file(tmp_path: Path) -> None:
    assert len(ALIAS_BOMB) < 500
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    bad = typo_file(tmp_path)
    done = validate_in_child("--output", "json", str(bomb), str(bad))
    assert done.returncode == 1, done.stderr
    problems = json.loads(done.stdout)
    check_output("policy_validate", problems)
    typo_line = bad.read_text().count("\n", 0, bad.read_text().index("prioirty")) + 1
    assert [(p["file"], p["line"], p["column"], p["message"].split(";")[0]) for p in problems] == [
        (str(bad), typo_line, 3, "unknown field 'prioirty' in spec"),
        (
            str(bomb),
            7,  # `g`: the first node found to hold more than 1,000,000 values (5.4 million)
            4,
            "cannot read the file past here: it holds more than 1,000,000 values "
            "(aliases expanded)",
        ),
    ]


def test_the_value_limit_is_for_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anchors are per document, so a file of many documents, each under the limit,
    could hold many bombs: the limit counts the values of all of them."""
    monkeypatch.setattr(loader, "MAX_NODES", 1000)
    each = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: [" + ", ".join(["*a"] * 20) + "]\n"
    docs, problems = loader.load_text("---\n".join([each] * 12), "many.yaml")
    assert len(docs) == 4  # 236 values each
    assert [(p.line, p.column, p.message) for p in problems] == [
        (
            4 * 3 + 2,  # `b:` of the 5th document, where the file passes the limit
            4,
            "cannot read the file past here: it holds more than 1,000 values (aliases expanded)",
        )
    ]


def test_an_alias_inside_the_node_it_names_is_one_problem() -> None:
    docs, problems = loader.load_text("a: 1\n---\nb: &x [1, *x]\n---\nc: 2\n", "r.yaml")
    assert [d.data for d in docs] == [{"a": 1}, {"c": 2}]
    assert [str(p) for p in problems] == [
        "r.yaml:3:4: error: cannot read the document: alias *x is used inside the node it "
        "names, so it never ends"
    ]


def test_aliases_cannot_nest_past_the_depth_limit() -> None:
    # Each alias adds 90 levels, each document itself stays under the limit.
    text = "a1: &a1 " + "[" * 90 + "]" * 90 + "\n"
    for i in range(1, 4):
        text += f"a{i + 1}: &a{i + 1} " + "[" * 90 + f"*a{i}" + "]" * 90 + "\n"
    _, problems = loader.load_text(text, "d.yaml")
    assert [p.message for p in problems] == [
        "cannot read the document: its aliases nest this node deeper than 100 levels"
    ]


def test_deep_nesting_is_one_problem_and_hides_no_other_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("links: " + "[" * 3000 + "]" * 3000 + "\n")
    bad = typo_file(tmp_path)
    done = validate_in_child("--output", "json", str(deep), str(bad))
    assert done.returncode == 1, done.stderr
    problems = json.loads(done.stdout)
    check_output("policy_validate", problems)
    assert [(p["file"], p["message"].split(";")[0]) for p in problems] == [
        (str(bad), "unknown field 'prioirty' in spec"),
        (str(deep), "cannot read the file past here: it nests deeper than 100 levels"),
    ]
    # At the bracket that opens level 101 (the top mapping is level 1).
    assert (problems[1]["line"], problems[1]["column"]) == (1, len("links: ") + 100)


def test_a_nul_character_is_one_sentence_at_its_place(tmp_path: Path) -> None:
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"kind: Topology\nmetadata: {name: a\x00b}\n")
    docs, problems = load_file(path)
    assert docs == []
    assert [str(p) for p in problems] == [
        f"{path}:2:19: error: YAML does not parse: the character U+0000 is not allowed in YAML"
    ]
