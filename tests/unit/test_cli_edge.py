"""The CLI edge: every error is one sentence on stderr and a non-zero exit."""

from __future__ import annotations

import pytest
import typer

from controlplane import __version__
from controlplane.cli import main
from controlplane.errors import FencedError, UnavailableError


@pytest.fixture
def failing_command() -> typer.Typer:
    """Mount a throwaway command group that raises what the test asks for."""
    group = typer.Typer()

    @group.command()
    def boom(kind: str) -> None:
        if kind == "unavailable":
            raise UnavailableError("etcd at 127.0.0.1:1 cannot be reached; start it")
        if kind == "fenced":
            raise FencedError("epoch 3 is older than 7")
        raise RuntimeError("something unexpected")

    @group.command()
    def ok() -> None:
        typer.echo("fine")

    main.app.add_typer(group, name="testing-only")
    yield group
    main.app.registered_groups = [
        g for g in main.app.registered_groups if g.typer_instance is not group
    ]


def test_meridian_error_is_one_sentence(
    failing_command: typer.Typer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main.run(["testing-only", "boom", "unavailable"])
    err = capsys.readouterr().err
    assert status == 1
    assert err == "error: etcd at 127.0.0.1:1 cannot be reached; start it\n"


def test_unexpected_error_has_no_traceback_without_debug(
    failing_command: typer.Typer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main.run(["testing-only", "boom", "other"])
    err = capsys.readouterr().err
    assert status == 1
    assert "Traceback" not in err
    assert err.strip() == (
        "error: internal error: something unexpected (run with --debug for the traceback)"
    )


def test_debug_shows_the_traceback(
    failing_command: typer.Typer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main.run(["--debug", "testing-only", "boom", "fenced"])
    err = capsys.readouterr().err
    assert status == 1
    assert "Traceback" in err
    assert err.rstrip().endswith("error: epoch 3 is older than 7")


def test_success_exits_zero(
    failing_command: typer.Typer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.run(["testing-only", "ok"]) == 0
    assert capsys.readouterr().out == "fine\n"


def test_usage_error_is_one_sentence_and_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["stack", "status", "--output", "yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'yaml'" in err
    assert err.endswith("see `meridian stack status --help`\n")
    assert err.count("\n") == 1


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["--version"]) == 0
    assert capsys.readouterr().out == f"meridian {__version__}\n"


def test_bad_setting_is_reported_by_the_edge(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MERIDIAN_ETCD", "nonsense")
    assert main.run(["region", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: MERIDIAN_ETCD holds 'nonsense'")
    assert err.count("\n") == 1


def test_errors_say_whether_they_are_retriable() -> None:
    assert UnavailableError.retriable
    assert not FencedError.retriable


def test_bare_group_prints_its_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(["stack"]) == 0
    captured = capsys.readouterr()
    assert "up" in captured.out and "down" in captured.out
    assert captured.err == ""


def test_interrupt_is_one_sentence(
    failing_command: typer.Typer, capsys: pytest.CaptureFixture[str]
) -> None:
    @failing_command.command()
    def interrupted() -> None:
        raise KeyboardInterrupt

    assert main.run(["testing-only", "interrupted"]) == 130
    assert capsys.readouterr().err == "error: interrupted.\n"
