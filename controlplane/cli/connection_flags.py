"""`--catalog`, `--etcd` and `--kafka` after any command that connects, as well as
before it (spec/cli.md: connection settings come from flags or `MERIDIAN_*`).

`meridian --etcd H:P region list` always worked: the root takes them. A runbook or a
user writes `meridian region list --etcd H:P` as often, and that was a usage error on
most commands. Each command mounted on the root gets the flags it does not declare
itself, added to its click command when it is loaded (controlplane/cli/lazy.py). A
flag given there overrides the root's, as a command's own flag does
(`common.settings_from`): the root's callback has run by the time a command's
arguments are parsed, so the value is put beside the root's.

A command gets only the flags it reads (`READS`, by command path; the catalog and
etcd where none is listed), so its help does not offer one that would be ignored:
commands that never connect get none (the delta engine, the local stack, policy
validate and schema, the demo and chaos, which run stacks of their own, and the
object commands that talk to an agent alone).
"""

from __future__ import annotations

import functools
from typing import Any

import typer
import typer.main
from typer import _click as click

from controlplane.cli.common import CatalogOpt, EtcdOpt, KafkaOpt

CATALOG, ETCD, KAFKA = "--catalog", "--etcd", "--kafka"
# Command paths (below the root), or the groups they are in, and the flags they read.
READS: dict[str, tuple[str, ...]] = {
    "delta": (),
    "stack": (),
    "demo": (),
    "chaos": (),
    "policy validate": (),
    "policy schema": (),
    "object put": (),
    "object get": (),
    "object rm": (),
    "object ls": (CATALOG,),  # which regions hold each version
    "policy plan": (CATALOG,),
    "db": (CATALOG,),
    "audit": (CATALOG, ETCD),  # ETCD: how far behind each region's records are
    "audit failovers": (CATALOG,),
    "history": (CATALOG,),
    "region show": (ETCD,),
    "pause": (ETCD,),  # etcd alone: maintenance mode must work while the catalog is away
    "resume": (ETCD,),
    "dataset evict": (ETCD,),
    "replicator run": (CATALOG, ETCD, KAFKA),  # the one with Kafka (and `agent serve`'s own)
}


def reads(path: str) -> tuple[str, ...]:
    """The connection flags the command at `path` reads."""
    words = path.split()
    for n in range(len(words), 0, -1):
        found = READS.get(" ".join(words[:n]))
        if found is not None:
            return found
    return (CATALOG, ETCD)


def add_connection_flags(name: str, command: click.Command) -> None:
    """Give every command under `name` (mounted on the root) the connection flags it
    reads and does not declare itself."""
    options = _options()
    for path, leaf in _leaves(name, command):
        declared = {opt for param in leaf.params for opt in getattr(param, "opts", ())}
        for flag in reads(path):
            if flag not in declared:
                leaf.params.append(options[flag])


@functools.cache
def _options() -> dict[str, click.Parameter]:
    """The three flags as typer builds them (the same help as the commands' own), each
    putting its value beside the root's instead of passing it to the command."""
    holder = typer.Typer(add_completion=False)

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
