"""`meridian region list | drain | undrain`."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from controlplane.cli.common import Output, OutputOpt, emit, resolve_output, settings_from
from controlplane.cli.runbook import DryRunOpt, ReasonOpt, YesOpt, confirm, emit_results, print_plan

app = typer.Typer(
    help="Regions: liveness, state, ownership; drain and undrain.", no_args_is_help=True
)


@app.command("list")
def list_regions(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Regions, jurisdiction, state, liveness, datasets owned."""
    from controlplane.coordination.orchestration.session import open_session

    async def go() -> list[dict[str, object]]:
        async with open_session(settings_from(ctx)) as s:
            c = await s.runbooks.context()
        return [
            {
                "name": name,
                "jurisdiction": jur,
                "state": c.view.state_of(name).value,
                "alive": c.view.is_alive(name),
                "owns": c.view.owned_by(name),
            }
            for name, jur in sorted(c.jurisdictions.items())
        ]

    emit(asyncio.run(go()), output, columns=["name", "jurisdiction", "state", "alive", "owns"])


@app.command("show")
def show_region(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="the region")],
    output: OutputOpt = None,
) -> None:
    """That region's agents: endpoint, weight, usage, objects, liveness; the rebalance in
    progress with its remaining bytes; the cache."""
    from agents.placement.report import region_report
    from controlplane.adapters.etcd import EtcdCoordination

    settings = settings_from(ctx)

    async def go() -> dict[str, object]:
        coord = EtcdCoordination(
            [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
        )
        await coord.connect()
        try:
            return await region_report(coord, region, settings.copies_of(region))
        finally:
            await coord.close()

    doc = asyncio.run(go())
    if resolve_output(output) is Output.json:
        emit(doc, output)
        return
    rebalance = doc["rebalance"]
    moving = (
        "none"
        if not isinstance(rebalance, dict)
        else (
            f"{rebalance['remaining_objects']} object(s), {rebalance['remaining_bytes']} bytes left"
        )
    )
    cache = doc.get("cache")
    cached = (
        "none"
        if not isinstance(cache, dict)
        else (
            f"{cache['bytes']} of {cache['limit_bytes']} bytes, hit rate "
            f"{float(str(cache['hit_rate'])):.0%}"
        )
    )
    agents = doc["agents"]
    emit(
        agents if isinstance(agents, list) else [],
        output,
        columns=[
            *("id", "endpoint", "weight", "objects", "bytes", "alive", "state"),
            "records_behind_s",
        ],
        title=(
            f"{region}: {doc['copies']} cop(ies) per object; rebalance: {moving}; cache: {cached}"
        ),
    )


@app.command()
def drain(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="the region to drain")],
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    reason: ReasonOpt = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="seconds each switchover may wait to catch up")
    ] = 30.0,
    output: OutputOpt = None,
) -> None:
    """Switch every dataset it owns elsewhere, and stop it taking ownership."""
    from controlplane.coordination.orchestration.runbooks import NotMovedError
    from controlplane.coordination.orchestration.session import open_session

    async def go() -> None:
        async with open_session(settings_from(ctx)) as s:
            plan, _ = await s.runbooks.plan_drain(region)
            print_plan(plan, f"drain of {region}", output, dry_run=dry_run)
            if dry_run:
                return
            if plan.unmoved:
                # A planned drain does all or nothing: a dataset with no eligible
                # target would stay, writable, on a region the operator is emptying.
                raise NotMovedError(f"drain of {region} refused, nothing changed", plan.unmoved)
            confirm(f"Drain {region} ({len(plan.moves)} dataset(s) to move)?", yes)
            results, failed = await s.runbooks.run_drain(
                region, plan, reason=reason or f"drain of {region}", timeout_s=timeout_s
            )
            emit_results(results, output)
            left = await s.runbooks.left_behind(region, plan, failed)
            if left:
                raise NotMovedError(f"drain of {region} is incomplete", left)

    asyncio.run(go())


@app.command()
def undrain(ctx: typer.Context, region: Annotated[str, typer.Argument()]) -> None:
    """Let the region take ownership again."""
    from controlplane.coordination.orchestration.session import open_session

    async def go() -> None:
        async with open_session(settings_from(ctx)) as s:
            await s.runbooks.undrain(region)

    asyncio.run(go())
    typer.echo(f"{region} is active again")
