"""`meridian demo`: the main job on one machine (spec/cli.md, issue 15)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from controlplane.cli.common import settings_from


class DemoScale(StrEnum):
    small = "small"
    full = "full"


def demo(
    ctx: typer.Context,
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the regions running and print how to explore")
    ] = False,
    scale: Annotated[
        DemoScale, typer.Option("--scale", help="small: a few minutes; full: larger data")
    ] = DemoScale.small,
) -> None:
    """Three regions, a policy, checkpoints and corpus shards replicated, a region lost and
    failed over, an audit; exits 0 only when every step's check held."""
    from controlplane.demo.run import run_demo

    settings = settings_from(ctx)
    checks = run_demo(settings, keep=keep, scale=scale.value, say=typer.echo)
    typer.echo("")
    width = max((len(c.what) for c in checks), default=10)
    typer.echo(f"{'step':<14} {'check':<{width}}  held")
    for c in checks:
        typer.echo(f"{c.step:<14} {c.what:<{width}}  {'yes' if c.held else 'NO'}")
    failed = [c for c in checks if not c.held]
    if failed or not checks:
        raise typer.Exit(1)
