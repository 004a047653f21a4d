"""The plain parameter converters answer exactly as typer's pydantic adapters do.

For each shape the CLI uses, every value (hand-picked edge cases, then whatever
hypothesis makes up) goes through both: the same value of the same type comes
back, or the same error with the same message.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer import _click as click
from typer._coercion import RuntimeParam
from typer._coercion import build_runtime_param as typer_build

from controlplane.cli.fast_params import plain_runtime_param


class Color(StrEnum):
    red = "red"
    dark_blue = "dark-blue"


app = typer.Typer()


@app.command()
def shapes(
    text: Annotated[str, typer.Option()] = "d",
    maybe_text: Annotated[str | None, typer.Option()] = None,
    number: Annotated[int | None, typer.Option()] = None,
    ratio: Annotated[float, typer.Option()] = 1.5,
    flag: Annotated[bool, typer.Option()] = False,
    path: Annotated[Path | None, typer.Option()] = None,
    existing_file: Annotated[Path | None, typer.Option(exists=True, dir_okay=False)] = None,
    color: Annotated[Color | None, typer.Option()] = None,
    any_case: Annotated[Color | None, typer.Option(case_sensitive=False)] = None,
    files: Annotated[list[Path] | None, typer.Argument(dir_okay=False)] = None,
) -> None:
    """Every shape fast_params converts."""


@app.command()
def bounded(
    limit: Annotated[int | None, typer.Option(min=1)] = None,
) -> None:
    """A shape it leaves to typer."""


GROUP = typer.main.get_command(app)
assert isinstance(GROUP, typer.core.TyperGroup)
SHAPES = GROUP.commands["shapes"]
PARAMS = {p.name: p for p in SHAPES.params}
CTX = click.Context(SHAPES)


def outcome(runtime: RuntimeParam, param: Any, value: Any) -> tuple[str, Any, Any]:
    try:
        result = runtime.coerce(value, param=param, ctx=CTX)
    except click.ClickException as exc:
        return ("error", type(exc), exc.format_message())
    except Exception as exc:  # noqa: BLE001 - whatever it is, both must raise it alike
        return ("error", type(exc), str(exc))
    return ("value", type(result), repr(result))  # repr: nan == nan


def assert_same(name: str, value: Any) -> None:
    param = PARAMS[name]
    plain = plain_runtime_param(param.type_descriptor, typer_build)
    assert plain is not None, f"{name} should have a plain converter"
    typers = typer_build(param.type_descriptor)
    assert outcome(plain, param, value) == outcome(typers, param, value), (name, value)


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("places")
    (root / "file.yaml").write_text("x")
    return {"dir": str(root), "file": str(root / "file.yaml"), "missing": str(root / "no")}


CASES: dict[str, list[Any]] = {
    "text": ["", "x", " a ", "é", "--", "0", "d"],
    "maybe_text": [None, "", "x"],
    "number": [
        None,
        0,
        5,
        "0",
        "-0",
        "5",
        "-12",
        "007",
        "+5",
        " 5",
        "5 ",
        "1_000",
        "１",
        "abc",
        "",
        "12345678901234567890123",
        "-9223372036854775809",
    ],
    "ratio": [1.5, "1.5", "nan", "x", "1"],
    "flag": [True, False, "yes", "no", ""],
    "path": [None, "", "a//b/", "~", ".", "x\x00y"],
    "color": [None, "red", "RED", "dark-blue", "dark_blue", "blue", "", Color.red],
    "any_case": ["red", "RED", "Dark-Blue", "blue"],
}


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, values in CASES.items() for v in values])
def test_edge_cases_agree(name: str, value: Any) -> None:
    assert_same(name, value)


@pytest.mark.parametrize("where", ["dir", "file", "missing"])
def test_paths_agree_on_what_exists(where: str, places: dict[str, str]) -> None:
    assert_same("path", places[where])
    assert_same("existing_file", places[where])
    assert_same("files", (places[where],))
    assert_same("files", (places["file"], places[where]))
    assert_same("files", ("",))  # typer's message quotes '' as given, not '.'


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(max_size=30))
def test_any_text_agrees(value: str) -> None:
    for name in ("text", "number", "color", "any_case", "path"):
        assert_same(name, value)
    assert_same("files", (value, "x"))


def test_a_bounded_number_is_left_to_typer() -> None:
    (param,) = GROUP.commands["bounded"].params
    assert plain_runtime_param(param.type_descriptor, typer_build) is None


def test_the_cli_itself_uses_the_plain_converters() -> None:
    from typer import core as typer_core

    from controlplane.cli import main  # noqa: F401 - installs them

    assert typer_core.build_runtime_param is not typer_build
    runtime = typer_core.build_runtime_param(PARAMS["number"].type_descriptor)
    assert type(runtime).__name__ == "PlainRuntimeParam"
