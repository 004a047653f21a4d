"""`meridian delta patch` without typer, for the plain command lines a script runs.

A patch process on a file of a few MB spent most of its ~65 ms importing typer and
click (~25 ms) and the CLI's main module (~7 ms) before the engine started; the
engine itself took 5-30 ms. So `controlplane.cli.entry` hands `delta patch` command
lines to `run` first, which answers the ones it can read without doubt, in ~25 ms,
with the same effect, output and errors as the typer command (`delta.patch_cmd`):
three paths (the delta may be `-`), `--threads`/`-j N`, `--max-output-size N`, and
JSON output (`--output json`, or no `--output` off a terminal). Anything else
(`--help`, `--debug`, a table or CSV, a value that is not a plain number, a
progress bar on a terminal, an option it does not know) returns None, and the typer
command runs as before, with its own messages.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import native

# the typer command's bounds: delta._MAX_THREADS, delta._PROGRESS_MIN_BYTES
MAX_THREADS = 4
PROGRESS_MIN_BYTES = 64 << 20
INTERRUPTED = 130  # main.INTERRUPTED


def report_rows(stats: native.DeltaStats) -> list[dict[str, Any]]:
    """What every `meridian delta` command prints (the typer commands use it too)."""
    return [
        {
            "input_bytes": stats.input_bytes,
            "output_bytes": stats.output_bytes,
            "copy_bytes": stats.copy_bytes,
            "literal_bytes": stats.literal_bytes,
            "numeric_bytes": stats.numeric_bytes,
            "block_size": stats.block_len,
            "threads": stats.threads,
        }
    ]


def _parse(argv: list[str]) -> tuple[list[str], dict[str, int | str]] | None:
    """The paths and options of `delta patch ARGV`, or None when in any doubt."""
    names = {
        "--threads": "threads",
        "-j": "threads",
        "--max-output-size": "max_output_size",
        "--output": "output",
        "-o": "output",
    }
    paths: list[str] = []
    opts: dict[str, int | str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-" or not arg.startswith("-"):
            # As typer hands them over (`Path`): `./-` is standard input, `./a` is `a`.
            paths.append(os.fspath(Path(arg)))
            i += 1
            continue
        flag, eq, value = arg.partition("=")
        if flag not in names or names[flag] in opts or (eq and not flag.startswith("--")):
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        i += 1
        key = names[flag]
        if key == "output":
            if value not in ("table", "json", "csv"):
                return None
            opts[key] = value
        elif value.isascii() and value.isdigit():
            opts[key] = int(value)
        else:
            return None
    if len(paths) != 3:
        return None
    return paths, opts


def run(argv: list[str]) -> int | None:
    """Runs `meridian delta patch ARGV` and returns its exit status, or None when the
    typer command must run it instead (nothing has been done then)."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    (old, delta, out), opts = parsed
    output = opts.get("output")
    if output is None:
        output = "table" if sys.stdout.isatty() else "json"
    threads = opts.get("threads")
    if (
        output != "json"
        or (isinstance(threads, int) and not 1 <= threads <= MAX_THREADS)
        or (sys.stderr.isatty() and delta != "-" and _size(delta) >= PROGRESS_MIN_BYTES)
    ):
        return None  # a table or CSV (rich), the threads error's wording, a progress bar
    from controlplane.errors import MeridianError

    try:
        import native
        from controlplane.cli.interrupts import terminate_as_interrupt

        source: native.DeltaSource = delta
        if delta == "-":
            # unbuffered, so the engine reads the descriptor itself (nothing read ahead)
            source = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)  # noqa: SIM115
        max_output = opts.get("max_output_size")
        with terminate_as_interrupt():
            stats = native.patch(
                old,
                source,
                out,
                threads=threads
                if isinstance(threads, int)
                else max(1, min(os.cpu_count() or 1, 4)),
                max_output_size=max_output if isinstance(max_output, int) else None,
            )
        # common.emit's JSON form
        sys.stdout.write(json.dumps(report_rows(stats), indent=2, default=str) + "\n")
    # the edge of controlplane.cli.main.run, word for word
    except MeridianError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted.", INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the edge turns any failure into one sentence
        detail = str(exc) or type(exc).__name__
        return _fail(f"internal error: {detail} (run with --debug for the traceback)", 1)
    return 0


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code
