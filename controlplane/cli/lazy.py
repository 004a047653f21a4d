"""Command groups and commands that are imported only when they are used.

`meridian --version` must not pay for SQLAlchemy, the policy compiler or the stack
manager, so `main.py` names each group by "module:attribute" instead of importing
it. `LazyGroup` is the click group typer builds for the root: its `commands` map
knows every name from the start (for "did you mean" suggestions and the help
listing's order) and imports a module the first time its command is looked up,
which click does only for the command being run, or for all of them when the root's
help is printed. The click command built from the module is the very one
`app.add_typer` / `app.command` would have built, so help texts, flags and exit
statuses do not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
import typer.main
from typer import _click as click
from typer.core import TyperGroup
from typer.models import TyperInfo


@dataclass(frozen=True)
class Lazy:
    """A command mounted on the root as `name`, loaded from `target` ("module:attribute").

    The attribute is a `typer.Typer` (mounted as a group, like `app.add_typer`) or a
    command function (mounted as a command, like `app.command(name)`).
    """

    name: str
    target: str

    def load(self, root: LazyGroup) -> click.Command:
        from controlplane.cli.connection_flags import add_connection_flags

        command = self._build(root)
        add_connection_flags(self.name, command)
        return command

    def _build(self, root: LazyGroup) -> click.Command:
        module_name, _, attribute = self.target.partition(":")
        if not attribute:
            raise ValueError(f"lazy command {self.name!r}: {self.target!r} is not 'module:attr'")
        obj: Any = getattr(importlib.import_module(module_name), attribute)
        if isinstance(obj, typer.Typer):
            return typer.main.get_group_from_info(
                TyperInfo(obj, name=self.name),
                pretty_exceptions_short=root.pretty_exceptions_short,
                rich_markup_mode=root.rich_markup_mode,
                suggest_commands=root.suggest_commands,
            )
        if callable(obj):
            # Register it on a throwaway Typer so that the CommandInfo has exactly the
            # defaults `app.command(name)` gives.
            holder = typer.Typer()
            holder.command(self.name)(obj)
            return typer.main.get_command_from_info(
                holder.registered_commands[0],
                pretty_exceptions_short=root.pretty_exceptions_short,
                rich_markup_mode=root.rich_markup_mode,
            )
        raise TypeError(
            f"lazy command {self.name!r}: {self.target} is neither a Typer nor a function"
        )


class _Commands(MutableMapping[str, click.Command]):
    """Name -> command; a lazy entry is loaded (once) on its first lookup."""

    def __init__(self, root: LazyGroup, eager: Mapping[str, click.Command]) -> None:
        self._root = root
        self._pending: dict[str, Lazy] = {}
        self._loaded: dict[str, click.Command] = dict(eager)
        self._order: list[str] = list(eager)

    def add_lazy(self, entry: Lazy) -> None:
        if entry.name in self._loaded or entry.name in self._pending:
            raise ValueError(f"command {entry.name!r} is registered twice")
        self._pending[entry.name] = entry
        self._order.append(entry.name)

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            entry = self._pending[name]  # KeyError for an unknown name, as a dict would
            self._loaded[name] = entry.load(self._root)
            del self._pending[name]
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._pending.pop(name, None)
        if name not in self._order:
            self._order.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._loaded and name not in self._pending:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._pending.pop(name, None)
        self._order.remove(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._pending

    def loaded(self) -> list[str]:
        """The names whose modules have been imported so far (for tests)."""
        return [n for n in self._order if n in self._loaded]


class LazyGroup(TyperGroup):
    """A root group whose subclasses list their commands in `lazy` (see main.py).

    Commands lazily registered come first, in the order given, so `meridian --help`
    lists them as written; anything mounted eagerly with `app.add_typer` or
    `app.command` (tests do) follows.
    """

    lazy: ClassVar[tuple[Lazy, ...]] = ()
    pretty_exceptions_short: ClassVar[bool] = True

    def __init__(self, **kwargs: Any) -> None:
        eager: Mapping[str, click.Command] = kwargs.pop("commands", None) or {}
        super().__init__(**kwargs)
        commands = _Commands(self, {})
        for entry in self.lazy:
            commands.add_lazy(entry)
        for name, command in eager.items():
            commands[name] = command
        self.commands = commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        # TyperGroup's own version iterates items(), which would import every module.
        return list(self.commands)
