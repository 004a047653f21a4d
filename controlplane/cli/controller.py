"""`meridian controller run --region R`: the region controller daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.common import settings_from

app = typer.Typer(help="The region controller daemon.", no_args_is_help=True)


@app.command()
def run(
    ctx: typer.Context,
    region: Annotated[str, typer.Option("--region", help="the region this controller serves")],
    metrics: Annotated[
        str | None, typer.Option("--metrics", help="serve Prometheus metrics on HOST:PORT")
    ] = None,
    controller_id: Annotated[
        str | None, typer.Option("--id", help="this controller's id (default host-pid)")
    ] = None,
    lease_ttl_s: Annotated[
        int | None,
        typer.Option("--lease-ttl", help="liveness lease TTL in s [MERIDIAN_LEASE_TTL_S]"),
    ] = None,
    fence_dir: Annotated[
        Path | None,
        typer.Option(
            "--fence-dir",
            help="write a fenced canary for each owned dataset into this shared folder",
        ),
    ] = None,
) -> None:
    """Liveness lease, election, claims of home datasets, automatic failover."""
    from controlplane.controller.run import run_controller

    settings = settings_from(ctx, lease_ttl_s=lease_ttl_s)
    asyncio.run(
        run_controller(
            settings, region, controller_id=controller_id, metrics_addr=metrics, fence_dir=fence_dir
        )
    )
