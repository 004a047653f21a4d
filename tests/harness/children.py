"""Child processes of a test run (agents, controllers, replicators) die with it.

A fixture's teardown stops what it started, but a pytest killed by `timeout`, CI or
a second Ctrl-C never runs it, and children in a session of their own (which they
need: a test SIGSTOPs them, and a terminal's Ctrl-C must not reach them before the
teardown) would live on and keep registering in etcd. So every child started
through `popen` (or `asyncio.create_subprocess_exec(..., preexec_fn=die_with_us())`):

* asks the kernel to SIGKILL it when its parent dies (Linux `PR_SET_PDEATHSIG`),
  which covers a SIGKILLed pytest too. The kernel ties that to the *thread* that
  forked, so `popen` forks from one long-lived thread of its own, never from a
  worker thread that `asyncio.to_thread` may retire while the child should live;
* (through `popen`) is remembered, so that `kill_all` (run at exit, and on SIGTERM or SIGHUP once
  `install_signal_handlers` ran, as tests/conftest.py does) kills each one's process
  group.

Children stay in sessions of their own (`start_new_session`), as before.

`popen_logged` is how the harnesses start one (its output appended to a log file),
`ChildProcess` the signals and stops they share, `log_events` their structured log.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_spawner = ThreadPoolExecutor(1, thread_name_prefix="test-children")
_lock = threading.Lock()
_live: dict[int, subprocess.Popen[Any]] = {}


def die_with_us() -> Callable[[], None]:
    """A `preexec_fn` that makes the child die with the thread that forks it (see the
    module doc: call `popen`, or fork from a thread that lives as long as the child)."""
    parent = os.getpid()
    prctl = _libc.prctl if _libc is not None else None

    def preexec() -> None:
        # Runs in the child between fork and exec: nothing here may take a lock.
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **kwargs)` in a session of its own, killed with the run."""
    if "preexec_fn" in kwargs:
        raise ValueError("popen sets preexec_fn itself (die_with_us)")
    kwargs.setdefault("start_new_session", True)
    kwargs["preexec_fn"] = die_with_us()
    proc: subprocess.Popen[Any] = _spawner.submit(subprocess.Popen, list(argv), **kwargs).result()
    with _lock:
        for pid in [p for p, child in _live.items() if child.returncode is not None]:
            del _live[pid]
        _live[proc.pid] = proc
    return proc


def popen_logged(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """`popen` with `env` over this process's, no stdin, stdout and stderr appended to
    `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return popen(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


class ChildProcess:
    """Signals and stops for a harness object whose child is `self.proc`."""

    proc: subprocess.Popen[bytes] | None
    stop_timeout_s: float = 30

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("not started")
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM (SIGCONT first: a paused child could not handle it), then SIGKILL if
        it does not exit in time; the exit status, None when it had to be killed."""
        if self.proc is None:
            return None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)


def log_events(text: str) -> list[dict[str, object]]:
    """The JSON events of a child's log (structlog's lines), other lines skipped."""
    out: list[dict[str, object]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def kill_all() -> None:
    """SIGKILL the process group of every child still running (teardown never ran)."""
    with _lock:
        # Not reaped yet, so its pid (and group) cannot have been reused.
        running = [pid for pid, proc in _live.items() if proc.returncode is None]
    for pid in running:
        with contextlib.suppress(OSError):  # gone already, or not a group leader
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


atexit.register(kill_all)


def install_signal_handlers() -> None:
    """On SIGTERM or SIGHUP: kill the children, then die of the signal as before."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: FrameType | None, previous: object = previous) -> None:
            kill_all()
            if previous == signal.SIG_IGN:
                return
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
