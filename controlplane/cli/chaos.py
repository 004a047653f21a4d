"""`meridian chaos list | run`: the fault scenarios against a private stack."""

from __future__ import annotations

import re
import secrets
from typing import Annotated

import typer

from controlplane.cli.common import OutputOpt, emit, settings_from

app = typer.Typer(help="Chaos scenarios: WAN faults, crashes and pauses.", no_args_is_help=True)

_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
CSV_COLUMNS = ["scenario", "seed", "operations", "acked", "invariant", "held", "detail"]


def parse_duration(text: str) -> float:
    """A duration as the policy writes one (ms, s, m or h: policy.md), or bare seconds."""
    from controlplane.errors import InvalidInputError
    from controlplane.policy.units import parse_duration_s

    given = text.strip()
    if _SECONDS.match(given):
        return float(given)
    try:
        return parse_duration_s(given)
    except ValueError:
        raise InvalidInputError(
            f"--duration {text!r} is not a duration: a number with ms, s, m or h, such as 45s or 2m"
        ) from None


@app.command("list")
def list_scenarios(output: OutputOpt = None) -> None:
    """The scenarios, each with its fault and the invariants it checks."""
    from chaos.scenarios import SCENARIOS

    rows = [{"name": s.name, "fault": s.fault, "invariants": list(s.invariants)} for s in SCENARIOS]
    emit(rows, output, columns=["name", "fault", "invariants"])


@app.command()
def run(
    ctx: typer.Context,
    scenarios: Annotated[
        list[str] | None, typer.Argument(help="scenario names or numbers (default: all)")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="seed of the first scenario (default: random)")
    ] = None,
    duration: Annotated[
        str, typer.Option("--duration", help="faults per scenario, e.g. 45s or 2m")
    ] = "40s",
    output: OutputOpt = None,
) -> None:
    """Run scenarios against a private stack; exit 0 only when every invariant held."""
    from chaos.suite import pick, run_suite

    chosen = pick(scenarios or [])
    duration_s = parse_duration(duration)
    first = seed if seed is not None else secrets.randbelow(2**31)
    settings = settings_from(ctx, check_endpoints=False)
    results = run_suite(
        settings, chosen, first, duration_s, announce=lambda m: typer.echo(m, err=True)
    )
    from controlplane.cli.common import Output, resolve_output

    fmt = resolve_output(output)
    if fmt is Output.json:
        emit([r.as_json() for r in results], output)
    elif fmt is Output.csv:  # one header: a row per scenario and invariant
        rows = [
            {"scenario": r.scenario, "seed": r.seed, "operations": r.operations,
             "acked": r.acked, "invariant": v.name, "held": v.held, "detail": v.detail}
            for r in results
            for v in r.verdicts
        ]  # fmt: skip
        emit(rows, output, columns=CSV_COLUMNS)
    else:
        for r in results:  # a table per scenario, its counts in the title
            rows = [{"invariant": v.name, "held": v.held, "detail": v.detail} for v in r.verdicts]
            title = (
                f"{r.scenario} (seed {r.seed}): {r.operations} operations, {r.acked} acked "
                f"writes, {r.elapsed_s:g} s"
            )
            emit(rows, output, columns=["invariant", "held", "detail"], title=title)
    failed = [r for r in results if not r.held]
    for r in failed:
        typer.echo(
            f"chaos: {r.scenario} failed with seed {r.seed} (history and logs in {r.run_dir})",
            err=True,
        )
    if failed:
        raise typer.Exit(1)
