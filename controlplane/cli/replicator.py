"""`meridian replicator run --region R --agent ADDR`: the change-log applier of a region."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.common import settings_from

app = typer.Typer(help="The change-log applier of a region.", no_args_is_help=True)


@app.command()
def run(
    ctx: typer.Context,
    region: Annotated[str, typer.Option("--region", help="the destination region it applies to")],
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="HOST:PORT of the region's agent [MERIDIAN_AGENT] (default: one the region "
            "registered in etcd, replaced when its registration goes)",
        ),
    ] = None,
    metrics: Annotated[
        str | None, typer.Option("--metrics", help="serve Prometheus metrics on HOST:PORT")
    ] = None,
    replicator_id: Annotated[
        str | None,
        typer.Option(
            "--id", help="this replicator's id, naming its journal (default: the host name)"
        ),
    ] = None,
    journal: Annotated[
        Path | None,
        typer.Option(
            "--journal",
            help="its record journal (SQLite; default <home>/replicator/<region>-<id>.journal.db)",
        ),
    ] = None,
    max_in_flight: Annotated[
        int, typer.Option("--max-in-flight", min=1, help="events applied at once")
    ] = 64,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", min=1, help="attempts of a copy before it is failed")
    ] = 5,
) -> None:
    """Consume meridian.changes for REGION: guard, LWW, copy via the agent, record, commit."""
    import socket

    from controlplane.cli.region_agent import find_agent
    from replicator.config import ReplicatorConfig
    from replicator.run import run_replicator

    settings = settings_from(ctx, agent=agent)
    # None named: one the region registered in etcd (spec/cli.md gives `--region` alone).
    agent_address = settings.agent or asyncio.run(find_agent(settings, region))
    config = ReplicatorConfig(
        region=region,
        max_in_flight=max_in_flight,
        max_attempts=max_attempts,
        max_clock_skew_ms=settings.max_clock_skew_ms,
    )
    asyncio.run(
        run_replicator(
            settings,
            config,
            agent_address=agent_address,
            replicator_id=replicator_id or socket.gethostname(),
            metrics_addr=metrics,
            journal_path=journal,
            follow_agents=settings.agent is None,
        )
    )
