"""The CLI's import discipline: a command loads only what it needs (issue 9, section 4).

Timing is left to benchmarks/cli_bench.py; these tests look at `sys.modules` in a
fresh interpreter after a command ran, which does not depend on the machine's load.
A heavy import creeping back to the top of a command module, or into main.py, fails
here with the list of what was loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main

from controlplane import __version__
from controlplane.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "policy" / "data" / "example.yaml"

# What no quick command may load: engines' clients, the catalog, the stack manager...
NEVER = {
    "sqlalchemy",
    "alembic",
    "psycopg",
    "pydantic_settings",
    "etcd3aio",
    "aiokafka",
    "grpc",
    "prometheus_client",
    "httpx",
    "requests",
    "toxiproxy",
    "zstandard",
    "controlplane.settings",
    "controlplane.catalog.api",
    "controlplane.catalog.models",
    "controlplane.coordination",
    "controlplane.controller",
    "controlplane.stack",
    "controlplane.policy.apply",
    "controlplane.policy.publisher",
}
# ...and what only some need: the policy compiler and its pydantic models, rich,
# structlog (configured only once Meridian's logging module is imported).
COMPILER = {"controlplane.policy", "controlplane.policy.compiler", "pydantic", "ruamel"}
EXTRAS = {"rich", "structlog", "controlplane.logs", "asyncio"}

PROBE = """
import json, sys
from controlplane.cli.main import run
status = run(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"status": status, "modules": sorted(sys.modules)}, f)
"""


def loaded_by(tmp_path: Path, *argv: str) -> set[str]:
    """The modules (and their top-level packages) a fresh interpreter holds after `argv`."""
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *argv],
        capture_output=True,
        timeout=60,
        check=True,
    )
    report = json.loads(out.read_text())
    modules: set[str] = set()
    for name in report["modules"]:
        parts = name.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    modules.add(f"<status {report['status']}>")
    return modules


def command_modules(modules: set[str]) -> set[str]:
    return {
        m
        for m in modules
        if m.startswith("controlplane.cli.")
        and m.removeprefix("controlplane.cli.")
        not in {"main", "lazy", "fast_params", "connection_flags"}
        and m != "controlplane.cli.logging_setup"
    }


def test_version_loads_no_command_and_nothing_heavy(tmp_path: Path) -> None:
    modules = loaded_by(tmp_path, "--version")
    assert "<status 0>" in modules
    assert modules & (NEVER | COMPILER | EXTRAS) == set()
    assert command_modules(modules) == set()


ENTRY_PROBE = """
import json, sys
from controlplane.cli.entry import entry
try:
    entry()
except SystemExit as exc:
    sys.stderr.write(json.dumps({"status": exc.code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--debug", "--version"]])
def test_the_console_script_answers_version_alike_with_or_without_typer(
    argv: list[str],
) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["meridian"] == "controlplane.cli.entry:entry"
    done = subprocess.run(
        [sys.executable, "-c", ENTRY_PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stderr)
    assert report["status"] == 0
    assert done.stdout == f"meridian {__version__}\n"
    # The bare flag is answered before typer is imported; anything else goes through it.
    assert ("typer" in report["modules"]) is (argv != ["--version"])


def test_delta_signature_loads_only_the_delta_group(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    modules = loaded_by(
        tmp_path, "delta", "signature", str(empty), str(tmp_path / "e.sig"), "-o", "json"
    )
    assert "<status 0>" in modules
    assert modules & (NEVER | COMPILER | EXTRAS) == set()
    # (delta_fast: the typer-free `delta patch`, whose report rows the group shares;
    # interrupts: SIGTERM and SIGHUP taken as Ctrl-C, a few lines of the standard library)
    assert command_modules(modules) == {
        "controlplane.cli.common",
        "controlplane.cli.delta",
        "controlplane.cli.delta_fast",
        "controlplane.cli.interrupts",
    }


def test_policy_validate_loads_the_compiler_and_nothing_else_heavy(tmp_path: Path) -> None:
    modules = loaded_by(tmp_path, "policy", "validate", str(EXAMPLE))
    assert "<status 0>" in modules
    assert COMPILER.issubset(modules)
    assert modules & (NEVER | EXTRAS) == set()
    assert command_modules(modules) == {"controlplane.cli.common", "controlplane.cli.policy"}


def test_root_help_loads_every_group_but_none_of_their_dependencies(tmp_path: Path) -> None:
    modules = loaded_by(tmp_path, "--help")
    assert "<status 0>" in modules
    assert modules & (NEVER | COMPILER | {"structlog"}) == set()
    assert {f"controlplane.cli.{m}" for m in ("audit", "db", "runbook", "stack")} <= modules


def test_a_typo_is_answered_without_loading_any_group(tmp_path: Path) -> None:
    """`did you mean` needs only the names, which main.Commands knows without imports."""
    modules = loaded_by(tmp_path, "polcy")
    assert "<status 1>" in modules
    assert command_modules(modules) == set()


def test_every_lazy_command_loads_and_is_listed_in_order() -> None:
    root = typer.main.get_command(main.app)
    assert isinstance(root, main.Commands)
    names = [entry.name for entry in main.Commands.lazy]
    assert root.list_commands(None) == names
    assert root.commands.loaded() == []
    for name in names:
        command = root.get_command(None, name)
        assert command is not None and command.name == name
        assert command.help, f"{name} has no help text"
    assert root.commands.loaded() == names


@pytest.mark.parametrize(
    ("target", "problem"),
    [("controlplane.cli.since", "is not 'module:attr'"), ("json:dumps_nothing", "has no")],
)
def test_a_wrong_lazy_target_fails_loudly(target: str, problem: str) -> None:
    from controlplane.cli.lazy import Lazy

    root = typer.main.get_command(main.app)
    assert isinstance(root, main.Commands)
    with pytest.raises((ValueError, AttributeError), match=problem):
        Lazy("broken", target).load(root)


LOGS_PROBE = """
import sys
import typer
from controlplane import __version__
from controlplane.cli import main

group = typer.Typer()

@group.command()
def speak() -> None:
    assert "structlog" not in sys.modules, "structlog was imported before the command"
    from controlplane.logs import get_logger
    log = get_logger("probe")
    log.debug("quietly")
    log.info("aloud", answer=42)

@group.command()
def other() -> None:
    pass

main.app.add_typer(group, name="probe")
sys.exit(main.run(sys.argv[1:]))
"""


@pytest.mark.parametrize("debug", [False, True])
def test_logging_is_configured_when_meridians_logging_is_first_imported(debug: bool) -> None:
    """Not up front (structlog is slow to import), yet before any line is logged: JSON on
    stderr, nothing on stdout (unconfigured structlog would print there), at the level
    `--debug` asks for."""
    argv = ["--debug", "probe", "speak"] if debug else ["probe", "speak"]
    done = subprocess.run(
        [sys.executable, "-c", LOGS_PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert [e["event"] for e in events] == (["quietly", "aloud"] if debug else ["aloud"])
    assert events[-1]["answer"] == 42 and events[-1]["level"] == "info"
