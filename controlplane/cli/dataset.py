"""`meridian dataset list | show`: placements joined with live owners and epochs."""

from __future__ import annotations

import asyncio
import fnmatch
from typing import Annotated

import typer

from controlplane.cli.common import OutputOpt, emit, settings_from
from controlplane.coordination.catalog_bridge import CatalogBridge
from controlplane.coordination.session import open_session
from controlplane.errors import NotFoundError

app = typer.Typer(help="Datasets: class, policy, home, owner and epoch.", no_args_is_help=True)
COLUMNS = ["name", "class", "policy", "home", "owner", "epoch", "replicas", "lag_s"]


async def _rows(ctx: typer.Context, pattern: str) -> list[dict[str, object]]:
    async with open_session(settings_from(ctx)) as s:
        c = await s.runbooks.context()
    rows: list[dict[str, object]] = []
    for name, p in sorted(c.placements.items()):
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        owner = c.view.owners.get(name)
        rows.append(
            {
                "name": name,
                "class": p.dataset_class,
                "policy": p.policy,
                "home": p.home,
                "owner": owner.region if owner else None,
                "epoch": owner.epoch if owner else None,
                "replicas": list(p.replicas),
                "lag_s": None,  # replication lag is the replicator's metric (issue 3)
                "handing_over_to": owner.handing_over_to if owner else None,
            }
        )
    return rows


@app.command("list")
def list_datasets(
    ctx: typer.Context,
    glob: Annotated[str, typer.Option("--glob", help="shell-style filter on names")] = "*",
    output: OutputOpt = None,
) -> None:
    """Every dataset: class, policy, home, current owner and epoch, replica regions."""
    emit(asyncio.run(_rows(ctx, glob)), output, columns=COLUMNS)


@app.command()
def show(
    ctx: typer.Context, name: Annotated[str, typer.Argument()], output: OutputOpt = None
) -> None:
    """One dataset: the fields of `list`, with its objects and where each version lives."""
    rows = asyncio.run(_rows(ctx, glob_escape(name)))
    if not rows:
        raise NotFoundError(f"unknown dataset {name!r}: no applied policy places it")
    catalog = CatalogBridge.open(settings_from(ctx).catalog)
    try:
        objects = catalog.locations(name)
    finally:
        catalog.close()
    emit({**rows[0], "objects": objects}, output)


def glob_escape(name: str) -> str:
    """`name` as a glob matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
