"""`meridian delta signature|diff|patch`: the rdiff-style front of the native engine.

Outputs are atomic (temporary file, fsync, rename); on any error the command prints
one sentence, exits 1 and leaves no output file behind. A progress bar is drawn on
stderr when it is a terminal and the main input is large.

The engine (`native`) and rich's progress bar are imported inside the commands, not
here, so that the CLI starts fast (a signature of an empty file included).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controlplane.cli.common import OutputOpt, emit
from controlplane.cli.delta_fast import MAX_THREADS, PROGRESS_MIN_BYTES, report_rows
from controlplane.cli.interrupts import terminate_as_interrupt

if TYPE_CHECKING:
    import native

app = typer.Typer(help="Deltas of large files: rdiff-style, or numeric with OLD at hand.")

_PROGRESS_MIN_BYTES = PROGRESS_MIN_BYTES
# The engine's own bound (native.MAX_THREADS); kept in delta_fast so --help needs no import.
_MAX_THREADS = MAX_THREADS

ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        "-j",
        help=f"worker threads, 1..{_MAX_THREADS} (default: the CPUs, at most {_MAX_THREADS})",
        show_default=False,
    ),
]


def _threads(value: int | None) -> int:
    if value is None:
        return max(1, min(os.cpu_count() or 1, _MAX_THREADS))
    return value


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr for large inputs on a terminal, else nothing."""
    if total < _PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (  # only here: importing rich.progress costs ~50 ms
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
        console=None,
    )
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


def _report(stats: native.DeltaStats, output: OutputOpt) -> None:
    emit(report_rows(stats), output)


@app.command("signature")
def signature_cmd(
    old: Annotated[Path, typer.Argument(help="the file the receiver holds")],
    sig: Annotated[Path, typer.Argument(help="where to write its signature")],
    threads: ThreadsOpt = None,
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            help="block length in bytes (default: about the square root of OLD's size)",
        ),
    ] = None,
    output: OutputOpt = None,
) -> None:
    """Write the signature of OLD to SIG."""
    import native

    with terminate_as_interrupt(), _progress("signature", _size(old)) as progress:
        stats = native.signature(
            old, sig, threads=_threads(threads), block_size=block_size, progress=progress
        )
    _report(stats, output)


@app.command("diff")
def diff_cmd(
    base: Annotated[
        Path,
        typer.Argument(
            metavar="SIG|OLD", help="the signature of the receiver's file, or with --basis the file"
        ),
    ],
    new: Annotated[Path, typer.Argument(help="the new version of the file")],
    delta: Annotated[Path, typer.Argument(help="where to write the delta")],
    basis: Annotated[
        bool,
        typer.Option(
            "--basis",
            help="the first argument is OLD itself: numeric deltas for tensors "
            "(safetensors detected; --dtype for raw files)",
        ),
    ] = False,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="with --basis: one element type for a raw file (bf16, fp16, fp32, ...)"
        ),
    ] = None,
    threads: ThreadsOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write the delta that turns the signed file (or, with --basis, OLD) into NEW."""
    import native
    from controlplane.errors import InvalidInputError

    if dtype is not None and not basis:
        raise InvalidInputError("--dtype needs --basis: a signature carries no numbers.")
    with terminate_as_interrupt(), _progress("diff", _size(new)) as progress:
        if basis:
            stats = native.delta_basis(
                base, new, delta, dtype=dtype, threads=_threads(threads), progress=progress
            )
        else:
            stats = native.delta(base, new, delta, threads=_threads(threads), progress=progress)
    _report(stats, output)


@app.command("patch")
def patch_cmd(
    old: Annotated[Path, typer.Argument(help="the file the delta was made against")],
    delta: Annotated[Path, typer.Argument(help="the delta (a file, or - for standard input)")],
    out: Annotated[Path, typer.Argument(help="where to write the new file")],
    max_output_size: Annotated[
        int | None,
        typer.Option(
            "--max-output-size",
            help="refuse a delta that would write more bytes than this (the size you expect)",
        ),
    ] = None,
    threads: ThreadsOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write OUT from OLD and DELTA; verify both digests; on any error leave no OUT."""
    # (controlplane.cli.delta_fast runs the plain command lines of this one without
    # typer: a change here goes there too)
    import native

    # "-" reads the delta as it arrives on standard input (a pipe), with no spool
    source: native.DeltaSource = delta
    if str(delta) == "-":
        # unbuffered, so the engine reads the descriptor itself (nothing read ahead)
        source = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)  # noqa: SIM115
    with (
        terminate_as_interrupt(),
        _progress("patch", _size(delta) if str(delta) != "-" else 0) as progress,
    ):
        stats = native.patch(
            old,
            source,
            out,
            threads=_threads(threads),
            progress=progress,
            max_output_size=max_output_size,
        )
    _report(stats, output)
