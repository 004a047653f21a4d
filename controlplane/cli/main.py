"""The `meridian` command and its error edge.

Every command group lives in its own module and is mounted here by name, to be
imported only when it runs (see `Commands`); the console script enters through
`controlplane.cli.entry`, which answers a bare `--version` before typer is even
imported. `run` is the only place where an exception becomes a message: a
`MeridianError` prints its sentence, anything else prints a short internal-error
line; `--debug` adds the traceback. Both exit non-zero.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from controlplane import __version__
from controlplane.cli import fast_params
from controlplane.cli.lazy import Lazy, LazyGroup
from controlplane.cli.logging_setup import configure_logging_on_use
from controlplane.errors import MeridianError


class Commands(LazyGroup):
    """Every command of `meridian`, in the order its help lists them.

    To add a command group, write its module (a `typer.Typer` named `app`) and add one
    line here, `Lazy("name", "controlplane.cli.module:app")`; a top-level command is a
    function, `Lazy("name", "controlplane.cli.module:function")`. Do not import
    command modules in this file, and keep their own top-level imports light (typer
    and `controlplane.cli.common`): import what a command needs inside the command, so
    that no other command pays for it (tests/unit/test_cli_imports.py checks this).
    """

    lazy = (
        Lazy("switchover", "controlplane.cli.runbook:switchover"),
        Lazy("failover", "controlplane.cli.runbook:failover"),
        Lazy("pause", "controlplane.cli.runbook:pause"),
        Lazy("resume", "controlplane.cli.runbook:resume"),
        Lazy("history", "controlplane.cli.runbook:history"),
        Lazy("stack", "controlplane.cli.stack:app"),
        Lazy("policy", "controlplane.cli.policy:app"),
        Lazy("db", "controlplane.cli.db:app"),
        Lazy("audit", "controlplane.cli.audit:app"),
        Lazy("region", "controlplane.cli.region:app"),
        Lazy("dataset", "controlplane.cli.dataset:app"),
        Lazy("controller", "controlplane.cli.controller:app"),
        Lazy("delta", "controlplane.cli.delta:app"),
        Lazy("agent", "controlplane.cli.agent:app"),
        Lazy("object", "controlplane.cli.object:app"),
        Lazy("replicator", "controlplane.cli.replicator:app"),
        Lazy("replication", "controlplane.cli.replication:app"),
        Lazy("chaos", "controlplane.cli.chaos:app"),
        Lazy("demo", "controlplane.cli.demo:demo"),
    )


fast_params.install()  # typer converts plain values without importing pydantic

app = typer.Typer(
    name="meridian",
    help="Multi-datacenter replication and consistency control plane.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=Commands,
)

_debug = False
INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


def _version(value: bool) -> None:
    if value:
        typer.echo(f"meridian {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and debug logs")] = False,
    catalog: Annotated[str | None, typer.Option(help="catalog URL [MERIDIAN_CATALOG]")] = None,
    etcd: Annotated[str | None, typer.Option(help="etcd endpoints [MERIDIAN_ETCD]")] = None,
    kafka: Annotated[str | None, typer.Option(help="Kafka bootstrap [MERIDIAN_KAFKA]")] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    global _debug  # noqa: PLW0603 - the edge in run() must know it after click returns
    _debug = debug
    configure_logging_on_use("debug" if debug else "info")
    ctx.obj = {"overrides": {"catalog": catalog, "etcd": etcd, "kafka": kafka}}


def _fail(message: str, code: int) -> int:
    if _debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(f"error: {message}\n")
    return code


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on argv (default: sys.argv) and return the exit status."""
    global _debug  # noqa: PLW0603
    _debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        result = app(args=argv, prog_name="meridian", standalone_mode=False)
    except MeridianError as exc:
        return _fail(str(exc), exc.exit_code)
    except typer.Abort:
        return _fail("aborted.", 1)
    except typer.TyperException as exc:
        # A usage error is an error like any other: one sentence, exit 1. (Click's own
        # status 2 would read as "changes pending" to a CI job running `policy plan`.)
        if not exc.format_message():
            return 0  # a bare command group: its help was printed, and that was the ask
        ctx = getattr(exc, "ctx", None)
        hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
        return _fail(f"{exc.format_message().rstrip('.')}{hint}", 1)
    except typer.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return _fail("interrupted.", INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the edge turns any failure into one sentence
        detail = str(exc) or type(exc).__name__
        return _fail(f"internal error: {detail} (run with --debug for the traceback)", 1)
    if result == INTERRUPTED:  # typer turns Ctrl-C (and our SIGTERM) into a bare 130
        return _fail("interrupted.", INTERRUPTED)
    return result if isinstance(result, int) else 0


def entry() -> None:
    """The console script `meridian`."""
    sys.exit(run())
