"""`meridian stack up | status | down`: the real engines on loopback, for development and CI."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from controlplane.cli.common import OutputOpt, emit, settings_from
from controlplane.cli.interrupts import terminate_as_interrupt

app = typer.Typer(
    help="Start, inspect and stop the local stack of real engines.", no_args_is_help=True
)


@app.command()
def up(
    ctx: typer.Context,
    etcd_members: Annotated[
        int | None,
        typer.Option("--etcd-members", help="1 or 3 etcd members (default: as last started)"),
    ] = None,
    postgres: Annotated[bool, typer.Option("--postgres", help="also start PostgreSQL")] = False,
) -> None:
    """Install (first time) and start etcd, Kafka (KRaft) and Toxiproxy; wait until healthy."""
    from rich.console import Console

    from controlplane.stack.manager import Stack, endpoints

    err = Console(stderr=True)
    if etcd_members not in (None, 1, 3):
        raise typer.BadParameter("must be 1 or 3", param_hint="--etcd-members")
    settings = settings_from(ctx, check_endpoints=False)
    t0 = time.monotonic()
    # SIGTERM takes the same path as Ctrl-C, so `up` rolls back what it started.
    with terminate_as_interrupt():
        report = Stack(settings).up(
            etcd_members=etcd_members,
            postgres=postgres,
            progress=lambda m: err.print(f"[dim]{m}[/]"),
        )
    for name, where in endpoints(settings).items():
        if name != "postgres" or postgres:
            typer.echo(f"{name:32} {where}")
    err.print(
        f"stack up in {time.monotonic() - t0:.1f} s "
        f"(started: {', '.join(report.started) or 'none'}; "
        f"already up: {', '.join(report.already_up) or 'none'})"
    )


@app.command()
def status(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Each service: up or down, endpoint, pid, log file."""
    from controlplane.stack.manager import Stack

    rows = [row.as_json() for row in Stack(settings_from(ctx, check_endpoints=False)).status()]
    emit(rows, output, columns=["service", "state", "endpoint", "pid", "log"])


@app.command()
def down(ctx: typer.Context) -> None:
    """Stop only what `stack up` started (idempotent)."""
    from controlplane.stack.manager import Stack

    stopped = Stack(settings_from(ctx, check_endpoints=False)).down()
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
