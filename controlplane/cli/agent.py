"""`meridian agent serve --region R --root DIR --listen ADDR`: the node agent daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.common import settings_from

app = typer.Typer(help="The node agent daemon.", no_args_is_help=True)


@app.command()
def serve(
    ctx: typer.Context,
    region: Annotated[str, typer.Option("--region", help="the region this agent serves")],
    root: Annotated[Path, typer.Option("--root", help="the store's folder (one agent per root)")],
    listen: Annotated[
        str, typer.Option("--listen", help="serve the agent API on HOST:PORT (port 0: any)")
    ],
    metrics: Annotated[
        str | None, typer.Option("--metrics", help="serve Prometheus metrics on HOST:PORT")
    ] = None,
    keep_versions: Annotated[
        int, typer.Option("--keep-versions", help="versions of each object kept as delta bases")
    ] = 2,
    advertise: Annotated[
        str | None,
        typer.Option("--advertise", help="the HOST:PORT peers reach this agent at"),
    ] = None,
    weight: Annotated[
        int, typer.Option("--weight", help="this agent's share of its region's objects")
    ] = 1,
    grace_s: Annotated[
        float,
        typer.Option("--grace", help="seconds calls in flight get to finish on SIGTERM"),
    ] = 10.0,
    max_object_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-object-bytes",
            min=1,
            help="refuse a Put of more bytes (RESOURCE_EXHAUSTED); default: no cap",
        ),
    ] = None,
    lease_ttl_s: Annotated[
        int | None,
        typer.Option("--lease-ttl", help="registration lease TTL in s [MERIDIAN_LEASE_TTL_S]"),
    ] = None,
    etcd: Annotated[
        str | None, typer.Option("--etcd", help="comma-separated etcd endpoints [MERIDIAN_ETCD]")
    ] = None,
    catalog: Annotated[
        str | None, typer.Option("--catalog", help="catalog SQLAlchemy URL [MERIDIAN_CATALOG]")
    ] = None,
    kafka: Annotated[
        str | None, typer.Option("--kafka", help="Kafka bootstrap servers [MERIDIAN_KAFKA]")
    ] = None,
) -> None:
    """Store, agent API, registration, policy and ownership watch, metrics; stops on SIGTERM."""
    from agents.daemon.config import AgentConfig
    from agents.daemon.run import run_agent
    from agents.daemon.runtime import run

    settings = settings_from(ctx, lease_ttl_s=lease_ttl_s, etcd=etcd, catalog=catalog, kafka=kafka)
    config = AgentConfig(
        region=region,
        root=root,
        listen=listen,
        metrics=metrics,
        advertise=advertise,
        keep_versions=keep_versions,
        weight=weight,
        lease_ttl_s=settings.lease_ttl_s,
        stop_grace_s=grace_s,
        max_object_bytes=max_object_bytes,
    )
    run(run_agent(settings, config), settings.agent_loop)
