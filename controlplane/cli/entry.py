"""The `meridian` console script: `meridian --version` at once, anything else to main.

Importing typer takes about half of what `meridian --version` costs even with every
command loaded lazily (`main.Commands`), and the bare flag is what scripts and
health checks call most, so that one command line is answered here, before typer
is imported, with the very line main's `--version` prints. Every other command line,
`--version` with other arguments included, goes to `controlplane.cli.main.entry`.
"""

from __future__ import annotations

import sys


def entry() -> None:
    """The console script `meridian` (pyproject.toml, [project.scripts])."""
    if sys.argv[1:] == ["--version"]:
        from controlplane import __version__

        sys.stdout.write(f"meridian {__version__}\n")
        sys.stdout.flush()
        sys.exit(0)
    if sys.argv[1:3] == ["delta", "patch"]:
        # the plain patch command lines, without typer (delta_fast says which and why)
        from controlplane.cli import delta_fast

        status = delta_fast.run(sys.argv[3:])
        if status is not None:
            sys.exit(status)
    from controlplane.cli.main import entry as main_entry

    main_entry()
