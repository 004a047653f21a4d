"""Parameter values converted without pydantic for the plain cases, as typer would.

Typer 0.29 converts every command-line value (strings, numbers, paths, choices)
through a pydantic `TypeAdapter`. Importing pydantic and building the adapters
costs about 0.1 s per run on our machines, more than `meridian delta signature` of
a small file may take in all. So `install()` gives typer a cheaper converter for
the few plain shapes our commands use — `str`, `bool`, `int` without bounds,
`float`, `Path` and enum choices, and lists of these — that calls the very functions
typer's adapters call (`coerce_cli_choice`, `coerce_cli_path`) and otherwise does
what pydantic's lax mode does for those types. Anything else, and every value the
plain converter is not sure of (a number with leading zeros, a choice that does
not match, bytes...), goes to typer's own adapter, built on first need: so error
messages and edge cases are typer's, unchanged. tests/unit/test_cli_fast_params.py
holds the two to the same answers.

If a typer release moves these internals, `install()` leaves typer as it is (the
CLI is then only slower, and tests/unit/test_cli_imports.py says so).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

if TYPE_CHECKING:
    from typer._click import Context
    from typer._coercion import RuntimeParam, TypeDescriptor
    from typer.core import _TyperParameter

    Converter = Callable[[Any, _TyperParameter, Context], Any]
    Builder = Callable[[TypeDescriptor], RuntimeParam]

_DECLINE: Any = object()  # "not a plain case": typer's adapter decides
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")  # no '+', leading zeros, '_' or spaces

_installed = False


def install() -> bool:
    """Route plain parameters of every typer command in this process through
    `plain_runtime_param`; False (and typer left alone) if its internals moved."""
    global _installed  # noqa: PLW0603 - once per process
    if _installed:
        return True
    try:
        from typer import _coercion, _param_types
        from typer import core as typer_core
    except ImportError:
        return False
    needed = (
        callable(getattr(typer_core, "build_runtime_param", None))
        and hasattr(_coercion, "RuntimeParam")
        and hasattr(_param_types, "coerce_cli_choice")
        and hasattr(_param_types, "coerce_cli_path")
    )
    if not needed:
        return False
    typer_build: Builder = typer_core.build_runtime_param  # type: ignore[attr-defined]

    def build(descriptor: TypeDescriptor) -> RuntimeParam:
        plain = plain_runtime_param(descriptor, typer_build)
        return plain if plain is not None else typer_build(descriptor)

    # The name typer.core looks up each time a parameter's converter is first needed.
    typer_core.build_runtime_param = build  # type: ignore[attr-defined]
    _installed = True
    return True


def plain_runtime_param(descriptor: TypeDescriptor, typer_build: Builder) -> RuntimeParam | None:
    """A converter for a plain parameter, or None for typer to build its own."""
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return None
    annotation: Any = descriptor.annotation
    many = get_origin(annotation) is list
    item = get_args(annotation)[0] if many else annotation
    convert = _item_converter(item, descriptor)
    if convert is None:
        return None
    plain: RuntimeParam = _plain_class()(
        parameter_info=info,
        annotation=annotation,
        convert=convert,
        many=many,
        descriptor=descriptor,
        typer_build=typer_build,
    )
    return plain


@functools.cache
def _plain_class() -> type[Any]:
    """Defined on first use: typer's RuntimeParam is only imported once install() ran."""
    from typer._coercion import RuntimeParam

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        convert: Converter
        many: bool
        descriptor: TypeDescriptor
        typer_build: Builder
        fallback: list[RuntimeParam] = field(default_factory=list, compare=False)

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
            if self.many and isinstance(value, list | tuple):
                done = [self.convert(v, param, ctx) for v in value]
                if all(v is not _DECLINE for v in done):
                    return done  # pydantic's list adapter returns a list too
            elif not self.many:
                one = self.convert(value, param, ctx)
                if one is not _DECLINE:
                    return one
            if not self.fallback:
                self.fallback.append(self.typer_build(self.descriptor))
            return self.fallback[0]._coerce_value(value, param=param, ctx=ctx)

    return PlainRuntimeParam


def _item_converter(item: Any, descriptor: TypeDescriptor) -> Converter | None:
    from typer._click.exceptions import BadParameter
    from typer._param_types import coerce_cli_choice, coerce_cli_path, lenient_issubclass

    info = descriptor.parameter_info
    if lenient_issubclass(item, Enum):
        choices = list(item)

        def choice(value: Any, param: _TyperParameter, ctx: Context) -> Any:
            if not isinstance(value, str | Enum):
                return _DECLINE
            try:
                return coerce_cli_choice(
                    value, choices=choices, case_sensitive=info.case_sensitive, ctx=ctx
                )
            except ValueError:
                return _DECLINE  # typer's adapter words the error

        return choice
    if item is str:
        return lambda value, param, ctx: value if type(value) is str else _DECLINE
    if item is bool:  # a flag's value is a bool already; "yes" from an environment is not
        return lambda value, param, ctx: value if type(value) is bool else _DECLINE
    unbounded = info.min is None and info.max is None and not info.clamp
    if item is int and unbounded:

        def integer(value: Any, param: _TyperParameter, ctx: Context) -> Any:
            if type(value) is int:
                return value
            if type(value) is str and _PLAIN_INT.fullmatch(value):
                return int(value)
            return _DECLINE

        return integer
    if item is float and unbounded:
        return lambda value, param, ctx: value if type(value) is float else _DECLINE
    path_type: Any = info.path_type if info.path_type is not None else item
    if lenient_issubclass(item, Path) and lenient_issubclass(path_type, Path):

        def path(value: Any, param: _TyperParameter, ctx: Context) -> Any:
            if type(value) is not str:
                return _DECLINE
            # pydantic's lax Path is path_type(value); given a Path, typer's own
            # coerce_cli_path skips pydantic and makes every check it always makes.
            try:
                return coerce_cli_path(
                    path_type(value), info, path_type=path_type, param=param, ctx=ctx
                )
            except (BadParameter, ValueError):
                # Its messages quote the value as given ('' rather than '.'), and
                # pydantic makes a usage error of "embedded null byte": typer's
                # adapter words them.
                return _DECLINE

        return path
    return None
