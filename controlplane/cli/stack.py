"""`meridian stack up | status | down`: the real engines on loopback, for development and CI."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Start, inspect and stop the local stack of real engines.", no_args_is_help=True
)
