"""Start, find and stop the processes of the local stack.

Each service writes a pid file beside its data; `stop` only signals a pid whose
command line still names that service's run folder, so a recycled pid that now
belongs to someone else is never killed. A process of ours that the pid file no
longer names (a start-up read as failed while the server went on to serve) is found
by the same mark and adopted, so it is stopped, or reused, rather than holding its
port against every later start as "another process".
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import StackError


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free_ports(service: str, ports: Sequence[int]) -> None:
    for port in ports:
        if not port_is_free(port):
            raise StackError(
                f"{service} cannot start: port {port} on 127.0.0.1 is already taken by another "
                "process; stop it or choose other ports with the MERIDIAN_STACK_*_PORT settings"
            )


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _names(cmdline: str, path: str) -> bool:
    """`path` appears in `cmdline` as a whole path or a folder of one (so the mark of
    a run folder `.../run/kafka` is not read in `.../run/kafka2/...`)."""
    at = cmdline.find(path)
    while at >= 0:
        after = cmdline[at + len(path) : at + len(path) + 1]
        if after in ("", "/", " "):
            return True
        at = cmdline.find(path, at + 1)
    return False


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# Popen objects of the services this process started. Keeping them lets `stop` reap
# the child (no zombie in a long test run) and keeps Popen.__del__ from warning that
# a daemon we meant to outlive the call is "still running".
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ManagedProcess:
    """A service process identified by its pid file and a marker in its command line."""

    name: str
    pid_file: Path
    log_file: Path
    marker: str  # a path that appears in the command line of our process only

    def pid(self) -> int | None:
        """The pid if our process is running, else None (a stale pid file is ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        child = _CHILDREN.get(pid)
        if child is not None and child.poll() is None:
            # Our own child, still running: between its fork and its exec its cmdline is
            # still ours, without the marker. Read as "exited", a start-up was failed
            # and its server, once exec'd, left running unrecorded on its port.
            return pid
        if self.marker not in _cmdline(pid) or _is_zombie(pid):
            return None
        return pid

    def adopt_orphan(self) -> int | None:
        """A running process of ours that the pid file does not name: the root of the
        processes whose command line holds the marker, recorded in the pid file; None
        when there is none (or the pid file names one already)."""
        if self.pid() is not None:
            return None
        marked: set[int] = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                pid = int(entry.name)
                if _names(_cmdline(pid), self.marker) and not _is_zombie(pid):
                    marked.add(pid)
        roots = sorted(pid for pid in marked if _parent(pid) not in marked)
        if not roots:
            return None
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(f"{roots[0]}\n")
        return roots[0]

    def start(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> int:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            try:
                proc = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # survives the CLI; Ctrl-C does not reach it
                    env={**os.environ, **(env or {})},
                )
            except OSError as exc:
                raise StackError(f"{self.name} could not be started ({argv[0]}): {exc}") from exc
        _CHILDREN[proc.pid] = proc
        self.pid_file.write_text(f"{proc.pid}\n")
        # Until exec() happens the child's command line is still ours (Python's), so the
        # marker check would call it gone; wait for the exec, or for an early death.
        deadline = time.monotonic() + 5
        while self.marker not in _cmdline(proc.pid) and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.01)
        return proc.pid

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM, then SIGKILL after the timeout; then SIGKILL to whatever its process
        group still holds (children it left behind: they would keep its ports or files).
        Idempotent; True if something was stopped."""
        pid = self.pid() or self.adopt_orphan()
        if pid is None:
            self._forget_stale()
            _reap_exited()
            return False
        # Started in a session of its own, it leads its process group; read while it
        # runs, so that a group is only ever one this process led.
        group = pid if _group_of(pid) == pid else None
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.1)
        if self.pid() is not None:
            _signal(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 5
            while time.monotonic() < kill_deadline and self.pid() is not None:
                time.sleep(0.05)
        _reap(pid)
        if group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL, as a crash would (tests use it), then reap; True if it was running."""
        pid = self.pid() or self.adopt_orphan()
        if pid is None:
            return False
        _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.05)
        _reap(pid)
        return True

    def _forget_stale(self) -> None:
        """Drop the pid file of a process that is gone, reaping it if it was our child
        (an unreaped child stays a zombie, and its Popen warns at exit)."""
        with contextlib.suppress(OSError, ValueError):
            stale = int(self.pid_file.read_text().strip())
            child = _CHILDREN.get(stale)
            if child is not None and child.poll() is not None:
                del _CHILDREN[stale]
        self.pid_file.unlink(missing_ok=True)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)
    _reap_exited()


def _reap_exited() -> None:
    """Reap and forget every child of ours that has exited. Another process may kill a
    service we started and start its successor (a chaos run's faults do, on the test
    session's private stack): the pid file then names the successor, so `stop` never
    reaches our dead child, which stayed a zombie with a Popen warning at exit."""
    for pid, child in list(_CHILDREN.items()):
        if child.poll() is not None:
            del _CHILDREN[pid]


def wait_healthy(
    name: str,
    process: ManagedProcess,
    check: Callable[[], None],
    timeout_s: float,
) -> None:
    """Poll `check` until it passes; fail with one sentence naming the service and its log."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process.pid() is None:
            raise StackError(f"{name} exited during start-up; see its log file {process.log_file}")
        try:
            check()
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet healthy"
            last = exc
            time.sleep(0.25)
            continue
        return
    raise StackError(
        f"{name} did not become healthy within {timeout_s:.0f} s (last check: {last}); "
        f"see its log file {process.log_file}"
    )
