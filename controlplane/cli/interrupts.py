"""SIGTERM and SIGHUP during a command: unwind like Ctrl-C (exit 130, "interrupted").

Their default action ends the process at once, so no `finally` runs: `stack up` left
half a stack started, and `delta patch` its partial temporary output beside OUT. Taken
as KeyboardInterrupt, they cancel and clean up as Ctrl-C does (the delta engine runs on
a worker thread, so the signal is seen while it works).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, taken as Ctrl-C."""


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (main thread only). A
    signal the process inherited as ignored stays ignored: under `nohup`, a logout must
    not stop the command."""
    previous = {
        s: signal.signal(s, _raise)
        for s in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
