"""`meridian audit residency | transfers | dataset | failovers`: compliance answers.

`audit residency` exits 3 when it finds any violation, so CI and cron jobs can alert.
The answers from the agents' records (residency, transfers, dataset) say on stderr
how far behind each region's records are (records_lag.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from controlplane.cli.common import (
    CatalogOpt,
    Output,
    OutputOpt,
    emit,
    resolve_output,
    settings_from,
)
from controlplane.cli.since import parse_since

app = typer.Typer(
    help="Answer auditors: residency, transfers, datasets, failovers.", no_args_is_help=True
)

VIOLATIONS_EXIT = 3

SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="only the last DURATION (30m, 12h, 7d), or an RFC 3339 time"),
]


RESIDENCY_COLUMNS = [
    "kind",
    "dataset",
    "object",
    "version",
    "region",
    "jurisdiction",
    "allowed",
    "state",
    "at",
]
# Table and CSV columns: every field of the JSON rows (docs/audit.md lists them).
TRANSFER_COLUMNS = [
    "id",
    "dataset",
    "object",
    "version",
    "from",
    "to",
    "from_jurisdiction",
    "to_jurisdiction",
    "logical_bytes",
    "wire_bytes",
    "at",
    "outcome",
]
FAILOVER_COLUMNS = [
    "id",
    "dataset",
    "from",
    "to",
    "epoch",
    "kind",
    "outcome",
    "reason",
    "actor",
    "detected_at",
    "started_at",
    "completed_at",
    "rpo_versions",
]


def _say_records_lag(ctx: typer.Context) -> None:
    """On stderr: how far behind each region's records are (dataplane.md, *Records*),
    so an auditor knows how recent what the catalog answers is."""
    import asyncio

    from controlplane.cli.records_lag import records_lag

    asyncio.run(records_lag(settings_from(ctx, check_endpoints=False))).say()


@app.command()
def residency(ctx: typer.Context, catalog: CatalogOpt = None, output: OutputOpt = None) -> None:
    """Every replica and past transfer outside its dataset's residency (exit 3 if any)."""
    from controlplane.catalog.api import open_catalog

    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        rows = cat.residency_violations()
    _say_records_lag(ctx)
    if not rows and resolve_output(output) is Output.table:
        typer.echo("no residency violations: every replica and transfer is inside its residency")
        return
    emit(rows, output, columns=RESIDENCY_COLUMNS, title="residency violations")
    if rows:
        raise typer.Exit(VIOLATIONS_EXIT)


@app.command()
def transfers(
    ctx: typer.Context,
    since: SinceOpt = None,
    dataset: Annotated[str | None, typer.Option("--dataset", help="dataset glob")] = None,
    cross_border: Annotated[
        bool, typer.Option("--cross-border", help="only transfers between jurisdictions")
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, max=1_000_000_000, help="at most N rows")
    ] = None,
    catalog: CatalogOpt = None,
    output: OutputOpt = None,
) -> None:
    """Who copied what, from where to where, when, how many bytes."""
    from controlplane.catalog.api import open_catalog

    start = parse_since(since)
    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        rows = cat.transfers(
            since=start, dataset_glob=dataset, cross_border=cross_border, limit=limit
        )
    _say_records_lag(ctx)
    emit(rows, output, columns=TRANSFER_COLUMNS, title="transfers")


@app.command("dataset")
def dataset_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="dataset name")],
    catalog: CatalogOpt = None,
    output: OutputOpt = None,
) -> None:
    """Where each version of each object lives, with digests and states."""
    from controlplane.catalog.api import open_catalog

    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        rows = cat.dataset_locations(name)
    _say_records_lag(ctx)
    emit(
        rows,
        output,
        columns=[
            "object",
            "version",
            "digest",
            "size",
            "region",
            "jurisdiction",
            "state",
            "allowed",
            "at",
        ],
        title=name,
    )


@app.command()
def failovers(
    ctx: typer.Context,
    since: SinceOpt = None,
    catalog: CatalogOpt = None,
    output: OutputOpt = None,
) -> None:
    """The failover journal, oldest first."""
    from controlplane.catalog import audit as queries
    from controlplane.catalog.api import open_catalog

    start = parse_since(since)
    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        records = cat.list_failovers(start)
    rows = [
        {
            "id": r.id,
            "dataset": r.dataset,
            "from": r.from_region,
            "to": r.to_region,
            "epoch": r.epoch,
            "kind": r.kind,
            "reason": r.reason,
            "actor": r.actor,
            "detected_at": queries.rfc3339(r.detected_at),
            "started_at": queries.rfc3339(r.started_at),
            "completed_at": queries.rfc3339(r.completed_at),
            "rpo_versions": r.rpo_versions,
            "outcome": r.outcome,
            "details": r.details_json,  # JSON only: the versions the new owner lacked
        }
        for r in records
    ]
    emit(rows, output, columns=FAILOVER_COLUMNS, title="failovers")
