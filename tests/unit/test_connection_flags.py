"""`--catalog`, `--etcd` and `--kafka` after the command as well as before it
(controlplane/cli/connection_flags.py): every command that connects takes them, the
command's flag wins over the root's, and commands that never connect do not offer
them."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from controlplane.cli.connection_flags import _leaves, reads
from controlplane.cli.main import Commands, app, run

FLAGS = {"--catalog", "--etcd", "--kafka"}


def leaves() -> list[tuple[str, set[str]]]:
    root = typer.main.get_command(app)
    assert isinstance(root, Commands)
    out: list[tuple[str, set[str]]] = []
    for name in root.list_commands(None):  # type: ignore[arg-type]
        for path, leaf in _leaves(name, root.commands[name]):
            out.append((path, {o for p in leaf.params for o in getattr(p, "opts", ())}))
    return out


def test_every_command_takes_the_flags_it_reads_and_no_other_option() -> None:
    found = dict(leaves())
    assert {"region list", "failover", "audit residency", "replicator run"} <= set(found)
    assert reads("delta diff") == reads("policy validate") == reads("demo") == ()
    assert reads("region list") == ("--catalog", "--etcd")
    assert reads("replicator run") == ("--catalog", "--etcd", "--kafka")
    assert reads("region show") == ("--etcd",) and reads("history") == ("--catalog",)
    assert reads("pause") == reads("resume") == ("--etcd",)  # no catalog: see runbook.py
    assert "--catalog" not in found["pause"]
    assert reads("audit failovers") == ("--catalog",) and reads("audit dataset")[1] == "--etcd"
    for path, opts in found.items():
        assert set(reads(path)) <= opts, path
        if path not in ("agent serve", "policy apply"):  # they declare their own
            assert opts & FLAGS == set(reads(path)), path
    # Nothing else came with them (typer's template adds completion flags by default).
    assert found["region list"] == {"--output", "-o", *reads("region list")}


def test_a_command_s_flag_is_used_and_wins_over_the_root_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = f"sqlite:///{tmp_path}/after.db"
    assert run(["region", "list", "--catalog", after]) != 0
    assert f"{tmp_path}/after.db does not exist" in capsys.readouterr().err
    before = f"sqlite:///{tmp_path}/before.db"
    assert run(["--catalog", before, "dataset", "list", "--catalog", after]) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path}/after.db does not exist" in err and "before.db" not in err
    assert run(["--catalog", before, "dataset", "list"]) != 0  # the root's alone still works
    assert f"{tmp_path}/before.db does not exist" in capsys.readouterr().err


def test_a_command_that_never_connects_refuses_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "schema", "--etcd", "127.0.0.1:2379"]) == 1
    assert "No such option: --etcd" in capsys.readouterr().err
    assert run(["region", "list", "--kafka", "127.0.0.1:9092"]) == 1  # read by no region command
    assert "No such option: --kafka" in capsys.readouterr().err
