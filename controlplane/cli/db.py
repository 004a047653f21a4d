"""`meridian db upgrade | current`: the catalog's Alembic migrations."""

from __future__ import annotations

import typer

from controlplane.cli.common import (
    CatalogOpt,
    Output,
    OutputOpt,
    emit,
    resolve_output,
    settings_from,
)

app = typer.Typer(help="Migrate the catalog's schema.", no_args_is_help=True)

# SQLAlchemy and Alembic (controlplane.catalog) load only when a db command runs
# (main.Commands), so each command imports what it uses.


@app.command()
def upgrade(
    ctx: typer.Context,
    catalog: CatalogOpt = None,
    revision: str = typer.Option("head", help="target migration"),
    output: OutputOpt = None,
) -> None:
    """Create or upgrade the catalog schema (idempotent)."""
    from controlplane.catalog import migrate
    from controlplane.catalog.engine import redacted

    url = migrate.refuse_in_memory(settings_from(ctx, catalog=catalog).catalog)
    migrate.upgrade(url, revision)
    now = migrate.current(url)
    if resolve_output(output) is Output.table:
        typer.echo(f"catalog {redacted(url)} is at migration {now}")
        return
    _emit_state(url, now, output)


STATE_COLUMNS = ["catalog", "current", "head", "up_to_date"]


def _emit_state(url: str, now: str | None, output: Output | None) -> None:
    from controlplane.catalog import migrate
    from controlplane.catalog.engine import redacted

    head = migrate.head_revision()
    row = {"catalog": redacted(url), "current": now, "head": head, "up_to_date": now == head}
    if resolve_output(output) is Output.csv:
        emit([row], Output.csv, columns=STATE_COLUMNS)
    else:
        emit(row, output)


@app.command()
def current(ctx: typer.Context, catalog: CatalogOpt = None, output: OutputOpt = None) -> None:
    """Print the catalog's migration and the newest one this Meridian knows."""
    from controlplane.catalog import migrate
    from controlplane.catalog.engine import redacted

    url = settings_from(ctx, catalog=catalog).catalog
    now = migrate.current(url)
    if resolve_output(output) is Output.table:
        head = migrate.head_revision()
        state = "up to date" if now == head else "run `meridian db upgrade`"
        typer.echo(f"catalog {redacted(url)}: migration {now or 'none'} (head {head}, {state})")
        return
    _emit_state(url, now, output)
