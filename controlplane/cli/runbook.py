"""Top-level runbook commands: switchover, failover, pause, resume, history.

Each is mounted on the root by name (`main.Commands`) and imports etcd and the
catalog only when it runs. Every runbook prints its plan first (moves with the
epoch they start from, and every rejected candidate with its reason), changes
nothing with `--dry-run`, asks for confirmation unless `--yes`, and journals
`--reason` with the OS user.
With `--output json` the plan (dry run) or the result is the only thing on stdout;
the plan and the prompt then go to stderr.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from controlplane.cli.common import Output, OutputOpt, emit, resolve_output, settings_from
from controlplane.cli.since import parse_since
from controlplane.errors import InvalidInputError

if TYPE_CHECKING:  # etcd and the catalog load only when a runbook runs (see main.Commands)
    from controlplane.coordination.orchestration.decide import Plan
    from controlplane.coordination.orchestration.failover import MoveResult
    from controlplane.coordination.protocols.view import Maintenance

DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="print the plan and change nothing")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="why, for the journal (default: the command)")
]


def print_plan(plan: Plan, title: str, output: Output | None, *, dry_run: bool) -> None:
    """The plan: JSON on stdout for a JSON dry run, else a table (on stderr if JSON follows)."""
    fmt = resolve_output(output)
    if dry_run and fmt is Output.json:
        emit(plan.as_json(), output)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=fmt is not Output.table, soft_wrap=True)
    moves = Table(title=title)
    for col in ("dataset", "from", "to", "epoch before"):
        moves.add_column(col)
    for m in plan.moves:
        moves.add_row(m.dataset, m.from_region, m.to_region, str(m.epoch_before))
    console.print(moves if plan.moves else f"{title}: nothing to move")
    if plan.rejected:
        rej = Table(title="rejected candidates")
        for col in ("dataset", "region", "reason"):
            rej.add_column(col)
        for r in plan.rejected:
            rej.add_row(r.dataset, r.region, r.reason)
        console.print(rej)
    for u in plan.unmoved:
        console.print(f"not movable: {u.dataset}: {u.reason}")
    for u in plan.retired:
        console.print(f"left as it is: {u.dataset}: {u.reason}")


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise InvalidInputError(f"{question} needs confirmation: pass --yes when not on a terminal")
    if not typer.confirm(question, err=True):
        raise typer.Abort()


def emit_results(results: list[MoveResult], output: Output | None) -> None:
    """The moves made: a table (none when nothing moved: the plan said so), or JSON/CSV rows."""
    if not results and resolve_output(output) is Output.table:
        return
    rows = [
        {
            "dataset": r.move.dataset,
            "from": r.move.from_region,
            "to": r.move.to_region,
            "epoch_before": r.move.epoch_before,
            "epoch": r.epoch,
            "rpo_versions": r.entry.rpo_versions,
        }
        for r in results
    ]
    emit(rows, output, columns=["dataset", "from", "to", "epoch_before", "epoch", "rpo_versions"])


def switchover(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Option("--dataset", help="the critical dataset to move")],
    to: Annotated[str | None, typer.Option("--to", help="the region that takes ownership")] = None,
    abort: Annotated[
        bool,
        typer.Option(
            "--abort",
            help="end a switchover left half-done (a handover mark with no runbook behind "
            "it): the previous owner's writes resume",
        ),
    ] = False,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    reason: ReasonOpt = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for the target to catch up")
    ] = 30.0,
    output: OutputOpt = None,
) -> None:
    """Planned: freeze writes, wait until the target caught up, move ownership, unfreeze."""
    if abort:
        if to is not None or dry_run:
            flag = "--to" if to is not None else "--dry-run"
            raise InvalidInputError(
                f"switchover --abort takes no {flag}: it ends the switchover of {dataset} "
                "in progress, whichever target it had"
            )
        abort_switchover(ctx, dataset, yes=yes, reason=reason, output=output)
        return
    if to is None:
        raise InvalidInputError(
            "switchover needs --to REGION (or --abort, to end a switchover left half-done)"
        )
    target = to
    from controlplane.coordination.orchestration.session import open_session

    async def go() -> None:
        async with open_session(settings_from(ctx)) as s:
            plan, _ = await s.runbooks.plan_switchover(dataset, target)
            print_plan(plan, f"switchover of {dataset}", output, dry_run=dry_run)
            if dry_run:
                return
            confirm(f"Switch {dataset} over to {target}?", yes)
            result = await s.runbooks.run_switchover(
                plan.moves[0],
                reason=reason or f"switchover to {target}",
                timeout_s=timeout_s,
            )
            emit_results([result], output)

    asyncio.run(go())


ABORT_COLUMNS = ["dataset", "from", "intended_to", "epoch", "began_at", "began_by", "journal_id"]


def abort_switchover(
    ctx: typer.Context, dataset: str, *, yes: bool, reason: str | None, output: Output | None
) -> None:
    """`switchover --dataset D --abort`: show the mark, ask, remove it, journal it."""
    from rich.console import Console

    from controlplane.coordination.orchestration.session import open_session

    async def go() -> None:
        async with open_session(settings_from(ctx)) as s:
            mark = await s.runbooks.plan_abort_switchover(dataset)
            fmt = resolve_output(output)
            console = Console(stderr=fmt is not Output.table, soft_wrap=True)
            began = f" at {mark.at}" if mark.at else ""
            by = f" by {mark.actor}" if mark.actor else ""
            lease = f" on lease {mark.lease:x}" if mark.lease else " on no lease"
            console.print(
                f"{mark.kind} of {dataset} from {mark.from_region} to {mark.to_region}, "
                f"frozen at epoch {mark.epoch}, began{began}{by}{lease}"
            )
            confirm(f"Abort it ({mark.from_region} keeps {dataset} at epoch {mark.epoch})?", yes)
            entry = await s.runbooks.abort_switchover(
                mark, reason=reason or "switchover --abort by an operator"
            )
            row = {
                "dataset": dataset,
                "from": mark.from_region,
                "intended_to": mark.to_region,
                "epoch": mark.epoch,
                "began_at": mark.at or None,
                "began_by": mark.actor or None,
                "journal_id": entry.id,
            }
            if fmt is Output.json:
                emit(row, output)
            else:
                emit([row], output, columns=ABORT_COLUMNS)

    asyncio.run(go())


def failover(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--from", help="the dead region")],
    to: Annotated[
        str | None, typer.Option("--to", help="the one target (default: each failover.order)")
    ] = None,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="fail over even though the source is alive")
    ] = False,
    reason: ReasonOpt = None,
    output: OutputOpt = None,
) -> None:
    """Emergency: move every dataset a dead region owns; names each rejected candidate."""
    from controlplane.coordination.orchestration.runbooks import NotMovedError
    from controlplane.coordination.orchestration.session import open_session

    async def go() -> None:
        async with open_session(settings_from(ctx)) as s:
            plan, pctx = await s.runbooks.plan_failover(source, to=to, force=force)
            print_plan(plan, f"failover of {source}", output, dry_run=dry_run)
            if dry_run:
                return
            results: list[MoveResult] = []
            if plan.moves:
                confirm(f"Fail over {len(plan.moves)} dataset(s) from {source}?", yes)
                results = await s.runbooks.run_failover(
                    plan, pctx, reason=reason or f"operator failover from {source}", force=force
                )
            emit_results(results, output)
            # An emergency moves what it can; whatever the dead region still owns is a
            # failure of the command, named with its reason.
            left = await s.runbooks.left_behind(source, plan)
            if left:
                raise NotMovedError(
                    f"failover of {source} is incomplete, {source} still owns them", left
                )

    asyncio.run(go())


def pause(
    ctx: typer.Context,
    reason: ReasonOpt = None,
) -> None:
    """Maintenance mode: automatic failover off (operators' runbooks still work)."""
    from controlplane.coordination.orchestration.session import open_coordination, os_actor
    from controlplane.coordination.protocols.view import set_maintenance

    async def go() -> Maintenance | None:
        # etcd alone: pausing must work while the catalog is away.
        async with open_coordination(settings_from(ctx)) as coord:
            return await set_maintenance(
                coord, True, reason=reason or "maintenance", actor=os_actor()
            )

    earlier = asyncio.run(go())
    if earlier is None:
        typer.echo("automatic failover paused")
    else:
        # Keep the first pause's reason, actor and time: they say why it is paused.
        typer.echo(f"automatic failover was already paused {earlier.describe()}; left as it was")


def resume(ctx: typer.Context) -> None:
    """Leave maintenance mode: automatic failover on again."""
    from controlplane.coordination.orchestration.session import open_coordination, os_actor
    from controlplane.coordination.protocols.view import set_maintenance

    async def go() -> None:
        async with open_coordination(settings_from(ctx)) as coord:
            await set_maintenance(coord, False, reason="", actor=os_actor())

    asyncio.run(go())
    typer.echo("automatic failover resumed")


HISTORY_COLUMNS = [
    "id",
    "dataset",
    "from",
    "to",
    "epoch",
    "kind",
    "outcome",
    "reason",
    "actor",
    "started_at",
    "completed_at",
    "rpo_versions",  # last: a script reading the columns by position still reads them
]


def history(
    ctx: typer.Context,
    since: Annotated[
        str | None,
        typer.Option("--since", help="only the last DURATION (30m, 12h, 7d), or an RFC 3339 time"),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """The failover journal: every ownership move, who made it, why, and when."""
    from controlplane.coordination.catalog_glue.catalog_bridge import CatalogBridge
    from controlplane.coordination.orchestration.journal import outcome_of
    from controlplane.coordination.timeutil import rfc3339

    start = parse_since(since)

    catalog = CatalogBridge.open(settings_from(ctx).catalog)
    try:
        entries = catalog.since(start)
    finally:
        catalog.close()
    rows = [
        {
            "id": e.id,
            "dataset": e.dataset,
            "from": e.from_region,
            "to": e.to_region,
            "epoch": e.epoch,
            "kind": e.kind,
            "reason": e.reason,
            "actor": e.actor,
            "started_at": rfc3339(e.started_at),
            "completed_at": rfc3339(e.completed_at),
            "rpo_versions": e.rpo_versions,
            "outcome": outcome_of(e),
            "aborted": outcome_of(e) == "aborted",
            "details": e.details,  # the versions the new owner lacked, and how measured
        }
        for e in entries
    ]
    emit(rows, output, columns=HISTORY_COLUMNS)
