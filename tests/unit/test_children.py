"""Children started through tests/harness/children.py die with the run that started
them, however it ends: SIGKILLed (no handler runs), SIGTERMed (as `timeout` and CI
do) or exiting without the teardown that would have stopped them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.children import popen
from waiting import until_sync

TESTS = Path(__file__).resolve().parents[1]

# A stand-in for pytest: starts a child that starts a grandchild in its group (as
# `sh` does), says both pids, then waits for its stdin to close.
PARENT = f"""
import subprocess, sys
sys.path.insert(0, {str(TESTS)!r})
from harness.children import install_signal_handlers, popen
install_signal_handlers()
child = popen(["sh", "-c", "sleep 120 & echo $!; wait"], stdout=subprocess.PIPE)
grandchild = child.stdout.readline().decode().strip()
print(child.pid, grandchild, flush=True)
sys.stdin.read()
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _signal_state(pid: int) -> str:
    """What the kernel says of a process that outlived its signal: each thread's state,
    what it waits in, and the signals it has pending, blocked, ignored and caught."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = (task / "status").read_text().splitlines()
            wchan = (task / "wchan").read_text()
        except OSError:
            continue
        wanted = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
        fields = [line for line in status if line.split(":")[0] in wanted]
        lines.append(f"task {task.name} (wchan {wchan}): " + "; ".join(fields))
    return "\n".join(lines) or "no /proc entry"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "exit"])
def test_children_die_with_the_run(end: str) -> None:
    parent = popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pids: list[int] = []
    try:
        assert parent.stdout is not None and parent.stdin is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids), pids
        if end == "exit":
            parent.stdin.close()
        else:
            parent.send_signal(getattr(signal, end))
        try:
            # 60 s: once, under a load of 25-30 on 2 cores, 30 s was not enough.
            parent.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent outlived its {end} by 60 s:\n{_signal_state(parent.pid)}")
        # SIGKILL: only the kernel's death signal can act, and it reaches the child
        # alone; otherwise the handlers kill the whole group.
        expect = pids[:1] if end == "SIGKILL" else pids
        until_sync(lambda: all(_gone(p) for p in expect), 10, what=f"{expect} to die ({end})")
    finally:
        parent.kill()
        parent.wait(10)
        for pid in pids:  # what the case under test left (the SIGKILLed one's grandchild)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if parent.stdin is not None:
            parent.stdin.close()
        if parent.stdout is not None:
            parent.stdout.close()
