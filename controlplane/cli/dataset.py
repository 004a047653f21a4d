"""`meridian dataset list | show`: the catalog's datasets joined with live owners and epochs;
`meridian dataset evict`: a region's copies of a dataset no longer placed there
(controlplane/coordination/orchestration/evict.py).

Every dataset in the catalog is listed, also one no applied policy places (registered
on first write, or its policy was removed): its policy and home are then null, its
class "standard" (the contract's class is never null, and no epoch fences it), and it
keeps whatever owner etcd still records. `lag_s` is the catalog's view
of replication lag (see `CatalogBridge.lag_seconds`); null for an unplaced dataset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.common import Output, OutputOpt, emit, resolve_output, settings_from
from controlplane.cli.runbook import DryRunOpt, YesOpt, confirm
from controlplane.errors import NotFoundError

if TYPE_CHECKING:  # the command imports it when run: `meridian --help` stays light
    from controlplane.coordination.orchestration.evict import Eviction, Kept

app = typer.Typer(help="Datasets: class, policy, home, owner and epoch.", no_args_is_help=True)
COLUMNS = ["name", "class", "policy", "home", "owner", "epoch", "replicas", "lag_s"]
OBJECT_COLUMNS = ["object", "version", "digest", "size", "region", "jurisdiction", "state", "at"]


async def _rows(ctx: typer.Context, pattern: str) -> list[dict[str, object]]:
    from controlplane.coordination.orchestration.session import open_session
    from controlplane.coordination.timeutil import utcnow

    async with open_session(settings_from(ctx)) as s:
        datasets = await asyncio.to_thread(s.catalog.datasets, pattern)
        view = await s.runbooks.context()
        now = utcnow()
        rows: list[dict[str, object]] = []
        for name, p in datasets:
            owner = view.view.owners.get(name)
            lag = None if p is None else await asyncio.to_thread(s.catalog.lag_seconds, p, now)
            rows.append(
                {
                    "name": name,
                    # Unplaced (no applied policy selects it): no epoch fences it, so
                    # "standard"; the contract's class is never null.
                    "class": p.dataset_class if p else "standard",
                    "policy": p.policy if p else None,
                    "home": p.home if p else None,
                    "owner": owner.region if owner else None,
                    "epoch": owner.epoch if owner else None,
                    "replicas": list(p.replicas) if p else [],
                    "lag_s": lag,
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
    """Every dataset: class, policy, home, current owner and epoch, replica regions, lag."""
    emit(asyncio.run(_rows(ctx, glob)), output, columns=COLUMNS)


@app.command()
def show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the exact dataset name (not a glob)")],
    output: OutputOpt = None,
) -> None:
    """One dataset: the fields of `list`, with its objects and where each version lives."""
    from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge

    rows = asyncio.run(_rows(ctx, glob_escape(name)))
    if not rows:
        raise NotFoundError(f"unknown dataset {name!r}: the catalog has no dataset of that name")
    catalog = CatalogBridge.open(settings_from(ctx).catalog)
    try:
        objects = catalog.locations(name)
    finally:
        catalog.close()
    fmt = resolve_output(output)
    if fmt is Output.json:
        emit({**rows[0], "objects": objects}, output)
    elif fmt is Output.csv:
        # One row per (object version, region), each carrying the dataset's fields.
        head = {k: v for k, v in rows[0].items() if k in COLUMNS}
        emit([{**head, **o} for o in objects] or [head], output, columns=COLUMNS + OBJECT_COLUMNS)
    else:
        _print_show(rows[0], objects)


# `dataset evict`: some copies remain in the region (each named, with why).
REMAINING_EXIT = 3
KEPT_COLUMNS = ["object", "version", "why"]
AGENT_COLUMNS = ["endpoint", "objects", "versions", "bytes", "kept", "error"]


@app.command()
def evict(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the exact dataset name")],
    region: Annotated[str, typer.Option("--region", help="the region to drop its copies from")],
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    output: OutputOpt = None,
) -> None:
    """Drop a region's copies of a dataset its applied policy no longer places there, each
    only once the placement's regions are shown to hold it (exit 3 while any stay; 1 when
    an agent failed). As CSV: a row per object that stays, with why."""
    from controlplane.adapters.etcd import EtcdCoordination
    from controlplane.coordination.orchestration.evict import evict_dataset

    settings = settings_from(ctx)

    async def asked(plan: Eviction) -> bool:
        if resolve_output(output) is Output.table:
            _print_plan(plan)
        confirm(
            f"Drop {len(plan.evictable)} object(s) of {name} from {region}"
            f" ({len(plan.kept)} stay)?",
            yes,
        )
        return True

    def progress(line: str) -> None:
        typer.echo(f"evict {name} from {region}: {line}", err=True)

    async def go() -> Eviction:
        endpoints = [f"{h}:{p}" for h, p in settings.etcd_endpoints]
        async with EtcdCoordination(endpoints, timeout_s=settings.etcd_timeout_s) as coord:
            return await evict_dataset(
                coord,
                settings.agent_address,
                name,
                region,
                dry_run=dry_run,
                confirm=None if dry_run else asked,
                progress=progress,
            )

    done = asyncio.run(go())
    fmt = resolve_output(output)
    if fmt is Output.json:
        emit(done.as_json(), Output.json)
    elif fmt is Output.csv:  # the rows an operator acts on: what stays, and why
        emit(_kept_rows(done.kept if done.dry_run else done.remaining), fmt, columns=KEPT_COLUMNS)
    elif done.dry_run:
        _print_plan(done)
    else:
        emit(done.agent_rows(), output, columns=AGENT_COLUMNS, title="agents asked")
        _print_kept(done.remaining, "still in the region")
    if done.failed:
        raise typer.Exit(1)
    if done.kept if done.dry_run else done.remaining:
        raise typer.Exit(REMAINING_EXIT)


def _print_plan(plan: Eviction) -> None:
    sets = ", ".join(f"{set_id}@{hlc}" for set_id, hlc in plan.sets) or "none"
    typer.echo(
        f"{plan.dataset} in {plan.region}: {len(plan.evictable)} object(s) may go, "
        f"{len(plan.kept)} stay; version sets proven: {sets}"
        + (" (dry run: nothing changed)" if plan.dry_run else "")
    )
    _print_kept(plan.kept, "staying in the region")


def _kept_rows(kept: Sequence[Kept]) -> list[dict[str, object]]:
    return [{"object": k.key, "version": k.version, "why": k.why} for k in kept]


def _print_kept(kept: Sequence[Kept], title: str) -> None:
    if kept:
        emit(_kept_rows(kept), Output.table, columns=KEPT_COLUMNS, title=title)


def _print_show(row: dict[str, object], objects: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    fields = Table(title=str(row["name"]), show_header=False)
    fields.add_column("field")
    fields.add_column("value", overflow="fold")
    for key in [*COLUMNS[1:], "handing_over_to"]:
        value = row.get(key)
        fields.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    console.print(fields)
    if not objects:
        console.print("no objects yet")
        return
    table = Table(title="objects: where each version lives")
    for col in OBJECT_COLUMNS:
        table.add_column(col, overflow="fold")
    for o in objects:
        table.add_row(*["" if o.get(c) is None else str(o.get(c)) for c in OBJECT_COLUMNS])
    console.print(table)


def glob_escape(name: str) -> str:
    """`name` as a glob matching only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
