"""A stack service replaced by another process leaves no zombie of ours behind
(controlplane/stack/process.py): a chaos run's faults kill a service of the session's
private stack and start its successor, so the pid file names a process that is not our
child, and our own dead child must still be reaped (else Popen warns at exit)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from waiting import until_sync

from controlplane.stack.process import ManagedProcess


def _zombie_or_gone(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return "zombie" if stat.rpartition(")")[2].split()[0] == "Z" else "running"


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_a_service_killed_and_replaced_elsewhere_is_reaped_when_the_stack_stops(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "service.data"
    proc = ManagedProcess("sleeper", tmp_path / "s.pid", tmp_path / "s.log", str(marker))
    argv = [sys.executable, "-c", "import time; time.sleep(120)", str(marker)]
    first = proc.start(argv)
    try:
        # Killed by someone else (not through this handle): our child is a zombie now.
        os.kill(first, signal.SIGKILL)
        until_sync(lambda: _zombie_or_gone(first) != "running", 10, f"{first} to die")
        assert _zombie_or_gone(first) == "zombie"
        second = proc.start(argv)  # its successor, as the other process would start it
        assert second != first
        assert proc.stop(timeout_s=10)
        assert _zombie_or_gone(second) != "running"
        assert _zombie_or_gone(first) == "gone"  # reaped, not left to the exit
    finally:
        proc.stop(timeout_s=10)
