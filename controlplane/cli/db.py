"""`meridian db upgrade | current`: the catalog's Alembic migrations."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from controlplane.cli.common import (
    CatalogOpt,
    Output,
    OutputOpt,
    emit,
    resolve_output,
    settings_from,
)
from controlplane.errors import ConfigError

if TYPE_CHECKING:  # SQLAlchemy and Alembic load only when a db command runs (main.Commands)
    from sqlalchemy.exc import SQLAlchemyError

    from controlplane.catalog.errors import CatalogUnavailableError

app = typer.Typer(help="Migrate the catalog's schema.", no_args_is_help=True)


def _unreachable(url: str, exc: SQLAlchemyError) -> CatalogUnavailableError:
    from sqlalchemy.exc import OperationalError

    from controlplane.catalog.engine import redacted
    from controlplane.catalog.errors import CatalogUnavailableError

    first = str(getattr(exc, "orig", exc)).strip().splitlines()
    verb = "is unreachable" if isinstance(exc, OperationalError) else "cannot be read"
    return CatalogUnavailableError(
        f"the catalog at {redacted(url)} {verb} ({first[0] if first else exc}); "
        "check --catalog / MERIDIAN_CATALOG"
    )


def _persistent(url: str) -> str:
    """Refuse an in-memory SQLite catalog: each connection would see a different, empty one."""
    from sqlalchemy import make_url

    parsed = make_url(url) if "://" in url else None
    if parsed is not None and parsed.get_backend_name() == "sqlite":
        db = parsed.database or ""
        if not db or db == ":memory:" or "mode=memory" in url:
            raise ConfigError(
                f"catalog URL {url!r} is an in-memory SQLite database, which no later command "
                "could see; give a file, e.g. sqlite:///.meridian/catalog.db"
            )
    return url


@app.command()
def upgrade(
    ctx: typer.Context,
    catalog: CatalogOpt = None,
    revision: str = typer.Option("head", help="target migration"),
    output: OutputOpt = None,
) -> None:
    """Create or upgrade the catalog schema (idempotent)."""
    from sqlalchemy.exc import SQLAlchemyError

    from controlplane.catalog import migrate
    from controlplane.catalog.engine import redacted

    url = _persistent(settings_from(ctx, catalog=catalog).catalog)
    try:
        migrate.upgrade(url, revision)
        now = migrate.current(url)
    except SQLAlchemyError as exc:
        raise _unreachable(url, exc) from exc
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
    from sqlalchemy.exc import SQLAlchemyError

    from controlplane.catalog import migrate
    from controlplane.catalog.engine import redacted

    url = settings_from(ctx, catalog=catalog).catalog
    try:
        now = migrate.current(url)
    except SQLAlchemyError as exc:
        raise _unreachable(url, exc) from exc
    if resolve_output(output) is Output.table:
        head = migrate.head_revision()
        state = "up to date" if now == head else "run `meridian db upgrade`"
        typer.echo(f"catalog {redacted(url)}: migration {now or 'none'} (head {head}, {state})")
        return
    _emit_state(url, now, output)
