"""`--catalog`, `--etcd` and `--kafka` after any command that connects, as well as
before it (spec/cli.md: connection settings come from flags or `MERIDIAN_*`).

`meridian --etcd H:P region list` always worked: the root takes them. A runbook or a
user writes `meridian region list --etcd H:P` as often, and that was a usage error on
most commands. Each command mounted on the root gets the flags it does not declare
itself, added to its click command when it is loaded (controlplane/cli/lazy.py). A
flag given there overrides the root's, as a command's own flag does
(`common.settings_from`): the root's callback has run by the time a command's
arguments are parsed, so the value is put beside the root's.

Commands that never connect do not get them (the delta engine, the local stack,
policy validate and schema, the demo, which runs a stack of its own), so their help
does not offer a flag that would be ignored.
"""

from __future__ import annotations

import functools
from typing import Any

import typer
import typer.main
from typer import _click as click

from controlplane.cli.common import CatalogOpt, EtcdOpt, KafkaOpt

# Command paths (below the root) that never connect.
OFFLINE = ("delta", "stack", "demo", "policy validate", "policy schema")


def add_connection_flags(name: str, command: click.Command) -> None:
    """Give every command under `name` (mounted on the root) the connection flags it
    lacks, unless it is OFFLINE."""
    for path, leaf in _leaves(name, command):
        if any(path == off or path.startswith(off + " ") for off in OFFLINE):
            continue
        declared = {opt for param in leaf.params for opt in getattr(param, "opts", ())}
        for flag, option in _options().items():
            if flag not in declared:
                leaf.params.append(option)


@functools.cache
def _options() -> dict[str, click.Parameter]:
    """The three flags as typer builds them (the same help as the commands' own), each
    putting its value beside the root's instead of passing it to the command."""
    holder = typer.Typer()

    @holder.command()
    def flags(catalog: CatalogOpt = None, etcd: EtcdOpt = None, kafka: KafkaOpt = None) -> None:
        """Never run: its parameters are the template."""

    out: dict[str, click.Parameter] = {}
    for param in typer.main.get_command(holder).params:
        name = str(param.name)
        param.expose_value = False
        param.callback = functools.partial(_remember, name)
        out[f"--{name}"] = param
    return out


def _leaves(path: str, command: click.Command) -> list[tuple[str, click.Command]]:
    subcommands: dict[str, click.Command] | None = getattr(command, "commands", None)
    if not subcommands:
        return [(path, command)]
    out: list[tuple[str, click.Command]] = []
    for name, sub in subcommands.items():
        out += _leaves(f"{path} {name}", sub)
    return out


def _remember(key: str, ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    if value is not None:
        root = ctx.find_root()
        if root.obj is None:
            root.obj = {}
        root.obj.setdefault("overrides", {})[key] = value
    return value
