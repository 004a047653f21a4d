"""The `meridian` command and its error edge.

Every command group lives in its own module and is mounted here. `run` is the
only place where an exception becomes a message: a `MeridianError` prints its
sentence, anything else prints a short internal-error line; `--debug` adds the
traceback. Both exit non-zero.
"""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from controlplane import __version__
from controlplane.cli import (
    audit,
    controller,
    dataset,
    db,
    delta,
    policy,
    region,
    runbook,
    stack,
)
from controlplane.errors import MeridianError
from controlplane.logs import configure_logging

app = typer.Typer(
    name="meridian",
    help="Multi-datacenter replication and consistency control plane.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(stack.app, name="stack")
app.add_typer(policy.app, name="policy")
app.add_typer(db.app, name="db")
app.add_typer(audit.app, name="audit")
app.add_typer(region.app, name="region")
app.add_typer(dataset.app, name="dataset")
app.add_typer(controller.app, name="controller")
runbook.register(app)
app.add_typer(delta.app, name="delta")

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
    configure_logging("debug" if debug else "info")
    ctx.obj = {"overrides": {"catalog": catalog, "etcd": etcd, "kafka": kafka}}


def _fail(message: str, code: int) -> int:
    if _debug:
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
