"""`meridian demo`: the main job on one machine (spec/cli.md, issue 15)."""

from __future__ import annotations

import signal
import sys
import threading
from enum import StrEnum
from types import FrameType
from typing import Annotated

import typer

from controlplane.cli.common import OutputOpt, emit, settings_from


class DemoScale(StrEnum):
    small = "small"
    full = "full"


class Stopped(KeyboardInterrupt):
    """SIGTERM during the run: unwind like Ctrl-C, so that every process is stopped."""


def demo(
    ctx: typer.Context,
    keep: Annotated[
        bool,
        typer.Option("--keep", help="leave everything running until Ctrl-C; print how to explore"),
    ] = False,
    scale: Annotated[
        DemoScale, typer.Option("--scale", help="small: about 3 minutes; full: larger data")
    ] = DemoScale.full,
    output: OutputOpt = None,
) -> None:
    """Four regions (three in the EU), a policy, checkpoints and corpus shards replicated,
    a region lost and failed over, an audit; exits 0 only when every step's check held.
    The table (or JSON list) of checks goes to stdout, the story to stderr."""
    from controlplane.demo.live import Narrator
    from controlplane.demo.run import Demo

    settings = settings_from(ctx, check_endpoints=False)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if keep and stop_wait.is_set():
            stop.set()  # the kept demo's normal end
            return
        raise Stopped(signal.Signals(signum).name)

    stop_wait = threading.Event()  # set while a kept demo waits for its end
    previous = signal.signal(signal.SIGTERM, on_signal)
    if keep:
        signal.signal(signal.SIGINT, on_signal)
    with Narrator(tty=sys.stderr.isatty()) as narrator:
        run = Demo(settings, scale=scale.value, say=narrator.say)
        try:
            run.start()
            narrator.watch(run.world, run.probe)
            checks = run.story()
            narrator.close()
            emit([c.as_json() for c in checks], output, columns=["step", "check", "held"])
            sys.stdout.flush()
            if keep:
                for line in run.explore():
                    narrator.say(line)
                stop_wait.set()
                while not stop.wait(1.0):
                    pass
                narrator.say("Stopping everything the demo started…")
        finally:
            narrator.close()
            run.stop()
            signal.signal(signal.SIGTERM, previous)
    if not checks or not all(c.held for c in checks):
        raise typer.Exit(1)
