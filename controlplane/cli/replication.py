"""`meridian replication status | resync`: where copies stand, and re-driving the missing.

`status` reads the catalog (replicator/status.py), and from etcd how far behind
each region's records are (records_lag.py). `resync` plans from the
catalog (replicator/resync.py), prints the plan, asks unless `--yes` (nothing is
changed with `--dry-run`), then has the region's agent (`--agent`) apply each
version from its holders, whose agents it finds in etcd.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Any

import typer

from controlplane.cli.common import Output, OutputOpt, emit, resolve_output, settings_from
from controlplane.cli.runbook import confirm

app = typer.Typer(
    help="Replication: status (standard and critical datasets) and resync.", no_args_is_help=True
)
STATUS_COLUMNS = [
    "dataset",
    "region",
    "completed",
    "pending",
    "failed",
    "lag_s",
    "records_behind_s",
]
OBJECT_COLUMNS = ["dataset", "region", "object", "version", "state", "attempts", "why"]
PLAN_COLUMNS = ["dataset", "key", "version", "op", "state", "holders"]


@app.command()
def status(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Option("--dataset", help="shell-style glob on names")] = "*",
    region: Annotated[str | None, typer.Option("--region", help="only this region")] = None,
    state: Annotated[
        str | None,
        typer.Option("--state", help="pending or failed: list those objects, with why"),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """Per dataset and region: completed, pending, failed, lag; with --state, the objects."""
    from datetime import UTC, datetime

    from controlplane.catalog.api import open_catalog
    from controlplane.cli.records_lag import records_lag
    from controlplane.errors import InvalidInputError, NotFoundError
    from replicator.status import replication_status

    if state is not None and state not in ("pending", "failed"):
        raise InvalidInputError(f"--state must be pending or failed, got {state!r}")
    settings = settings_from(ctx, check_endpoints=False)
    catalog = open_catalog(settings.catalog)
    try:
        if region is not None:
            known = sorted(r.name for r in catalog.list_regions())
            if region not in known:
                # A typo must not read as "nothing to report".
                raise NotFoundError(
                    f"unknown region {region!r}: the catalog's regions are "
                    f"{', '.join(known) or 'none (no policy applied)'}"
                )
        rows = replication_status(
            catalog, datetime.now(UTC), dataset_glob=dataset, region=region, state=state
        )
    finally:
        catalog.close()
    # What the catalog shows of each region is complete up to its records' lag.
    lag = asyncio.run(records_lag(settings))
    for row in rows:
        row["records_behind_s"] = lag.of(str(row["region"]))
    lag.say()
    if state is None or resolve_output(output) is Output.json:
        emit(rows, output, columns=STATUS_COLUMNS)
        return
    objects = [
        {"dataset": r["dataset"], "region": r["region"], **o} for r in rows for o in r["objects"]
    ]
    emit(objects, output, columns=OBJECT_COLUMNS)


@app.command()
def resync(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Option("--dataset", help="shell-style glob on names")],
    region: Annotated[str, typer.Option("--region", help="the region to bring up to date")],
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="HOST:PORT of an agent of REGION [MERIDIAN_AGENT] (default: one the region "
            "registered in etcd)",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan only")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="do not ask for confirmation")] = False,
    output: OutputOpt = None,
) -> None:
    """Re-drive every missing, pending or failed copy of REGION (also objects written
    before it was a replica); prints what it would copy first."""
    agent = agent or settings_from(ctx).agent
    code = asyncio.run(_resync(ctx, dataset, region, agent, dry_run, yes, output))
    if code:
        raise typer.Exit(code)


async def _resync(
    ctx: typer.Context,
    pattern: str,
    region: str,
    agent_address: str | None,
    dry_run: bool,
    yes: bool,
    output: Output | None,
) -> int:
    import fnmatch

    from controlplane.adapters.etcd import EtcdCoordination
    from controlplane.cli.region_agent import registered_agent
    from controlplane.policy.current import PolicyView
    from replicator.agent_grpc import GrpcAgent
    from replicator.catalog_link import CatalogLink
    from replicator.holders import RegistryHolders
    from replicator.resync import drive_resync, plan_resync

    settings = settings_from(ctx)
    catalog = CatalogLink(settings.catalog)
    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    try:
        await asyncio.to_thread(catalog.open)
        await coord.connect()
        async with PolicyView(coord) as view:
            policy = view.require()
            placements = [
                p
                for p in await asyncio.to_thread(catalog.list_placements)
                if fnmatch.fnmatchcase(p.dataset, pattern)
            ]
            items = await asyncio.to_thread(plan_resync, catalog.open(), placements, region)
            plan = [
                {
                    "dataset": i.dataset,
                    "key": i.key,
                    "version": str(i.version.hlc),
                    "op": i.version.op,
                    "state": i.state,
                    "holders": list(i.holders),
                }
                for i in items
            ]
            fmt = resolve_output(output)
            if dry_run or fmt is not Output.json:
                emit({"plan": plan} if fmt is Output.json else plan, output, columns=PLAN_COLUMNS)
            if dry_run or not items:
                if not items:
                    sys.stderr.write(f"nothing to resync in {region}\n")
                return 0
            if agent_address is None:  # found before asking: a refusal comes first
                agent_address = await registered_agent(settings, region, coord)
            # Asked on stderr (stdout keeps its one document), and refused off a
            # terminal without --yes, as the runbooks are.
            confirm(f"copy {len(items)} version(s) into {region}?", yes)

            registry = RegistryHolders(catalog, coord, route=settings.agent_address)
            async with GrpcAgent(agent_address, route=settings.agent_address) as agent:
                results = await _with_progress(
                    len(items),
                    lambda tick: drive_resync(
                        items,
                        region=region,
                        agent=agent,
                        records=catalog.open(),
                        policy=policy,
                        agents_of=registry.agents_of,
                        on_done=lambda _r: tick(),
                    ),
                )
            summary = [
                {
                    "dataset": r.item.dataset,
                    "key": r.item.key,
                    "version": str(r.item.version.hlc),
                    "outcome": r.outcome,
                    "error": r.error,
                }
                for r in results
            ]
            if fmt is Output.json:
                emit({"plan": plan, "results": summary}, output)
            failed = [r for r in results if r.outcome == "failed"]
            sys.stderr.write(
                f"resynced {len(results) - len(failed)} of {len(results)} version(s) "
                f"into {region}" + (f"; {len(failed)} failed" if failed else "") + "\n"
            )
            return 1 if failed else 0
    finally:
        await coord.close()
        await asyncio.to_thread(catalog.close)


async def _with_progress(total: int, run: Any) -> Any:
    """A progress bar on a terminal (stderr), nothing otherwise."""
    if not sys.stderr.isatty():
        return await run(lambda: None)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("resync", total=total)
        return await run(lambda: progress.advance(task))
