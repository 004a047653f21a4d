"""Options and output shared by every command group (connection flags, --output).

Every command module imports this one, so it imports nothing heavy at its top:
settings (pydantic-settings) and rich are loaded by the functions that use them.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from controlplane.settings import Settings


class Output(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


OutputOpt = Annotated[
    Output | None,
    typer.Option("--output", "-o", help="table (default on a terminal), json or csv"),
]
CatalogOpt = Annotated[
    str | None, typer.Option("--catalog", help="catalog SQLAlchemy URL [MERIDIAN_CATALOG]")
]
EtcdOpt = Annotated[
    str | None, typer.Option("--etcd", help="comma-separated etcd endpoints [MERIDIAN_ETCD]")
]
KafkaOpt = Annotated[
    str | None, typer.Option("--kafka", help="Kafka bootstrap servers [MERIDIAN_KAFKA]")
]


def settings_from(ctx: typer.Context, *, check_endpoints: bool = True, **flags: object) -> Settings:
    """Settings from the environment, overridden by global flags, then by command flags."""
    from controlplane.settings import load_settings

    merged: dict[str, object] = dict((ctx.find_root().obj or {}).get("overrides", {}))
    merged.update({k: v for k, v in flags.items() if v is not None})
    return load_settings(check_endpoints=check_endpoints, **merged)


def resolve_output(output: Output | None) -> Output:
    """The spec's default: a table on a terminal, JSON when piped."""
    if output is not None:
        return output
    return Output.table if sys.stdout.isatty() else Output.json


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def emit(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    output: Output | None,
    *,
    columns: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Print rows (or one JSON document) as a table, JSON or CSV on stdout."""
    fmt = resolve_output(output)
    if fmt is Output.json or isinstance(rows, Mapping):
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        return
    cols = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    if fmt is Output.csv:
        import csv

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(cols)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in cols])
        sys.stdout.write(buf.getvalue())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in cols:
        table.add_column(col, overflow="fold")  # wrap, never hide a path or an id
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in cols])
    # Off a terminal rich would assume 80 columns; a file or pipe gets the whole table.
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240).print(table)
