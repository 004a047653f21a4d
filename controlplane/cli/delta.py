"""`meridian delta signature|diff|patch`: the rdiff-style front of the native engine.

Outputs are atomic (temporary file, fsync, rename); on any error the command prints
one sentence, exits 1 and leaves no output file behind. A progress bar is drawn on
stderr when it is a terminal and the main input is large.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

import native
from controlplane.cli.common import OutputOpt, emit

app = typer.Typer(help="Rolling-hash deltas of large files (rdiff-style, streaming).")

_PROGRESS_MIN_BYTES = 64 << 20

ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads", "-j", help="worker threads (default: the number of CPUs)", show_default=False
    ),
]


def _threads(value: int | None) -> int:
    if value is None:
        return max(1, min(os.cpu_count() or 1, native.MAX_THREADS))
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
    emit(
        [
            {
                "input_bytes": stats.input_bytes,
                "output_bytes": stats.output_bytes,
                "copy_bytes": stats.copy_bytes,
                "literal_bytes": stats.literal_bytes,
                "block_size": stats.block_len,
            }
        ],
        output,
    )


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
    with _progress("signature", _size(old)) as progress:
        stats = native.signature(
            old, sig, threads=_threads(threads), block_size=block_size, progress=progress
        )
    _report(stats, output)


@app.command("diff")
def diff_cmd(
    sig: Annotated[Path, typer.Argument(help="the signature of the receiver's file")],
    new: Annotated[Path, typer.Argument(help="the new version of the file")],
    delta: Annotated[Path, typer.Argument(help="where to write the delta")],
    threads: ThreadsOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write the delta that turns the signed file into NEW."""
    with _progress("diff", _size(new)) as progress:
        stats = native.delta(sig, new, delta, threads=_threads(threads), progress=progress)
    _report(stats, output)


@app.command("patch")
def patch_cmd(
    old: Annotated[Path, typer.Argument(help="the file the delta was made against")],
    delta: Annotated[Path, typer.Argument(help="the delta")],
    out: Annotated[Path, typer.Argument(help="where to write the new file")],
    threads: ThreadsOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write OUT from OLD and DELTA; verify both digests; on any error leave no OUT."""
    with _progress("patch", _size(delta)) as progress:
        stats = native.patch(old, delta, out, threads=_threads(threads), progress=progress)
    _report(stats, output)
