"""`--catalog`, `--etcd` and `--kafka` after the command as well as before it
(controlplane/cli/connection_flags.py): every command that connects takes them, the
command's flag wins over the root's, and commands that never connect do not offer
them."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main

from controlplane.cli.connection_flags import OFFLINE, _leaves
from controlplane.cli.main import Commands, app, run


def leaves() -> list[tuple[str, set[str]]]:
    root = typer.main.get_command(app)
    assert isinstance(root, Commands)
    out: list[tuple[str, set[str]]] = []
    for name in root.list_commands(None):  # type: ignore[arg-type]
        for path, leaf in _leaves(name, root.commands[name]):
            out.append((path, {o for p in leaf.params for o in getattr(p, "opts", ())}))
    return out


def test_every_command_that_connects_takes_the_three_flags() -> None:
    found = leaves()
    offline = [p for p, _ in found if any(p == o or p.startswith(o + " ") for o in OFFLINE)]
    assert "delta diff" in offline and "policy validate" in offline and "demo" in offline
    for path, opts in found:
        flags = {"--catalog", "--etcd", "--kafka"} & opts
        if path in offline:
            assert not flags, path
        else:
            assert flags == {"--catalog", "--etcd", "--kafka"}, path
    assert {"region list", "failover", "audit residency", "replicator run"} <= {p for p, _ in found}


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
