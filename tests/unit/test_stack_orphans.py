"""A process of ours that the pid file does not name (a start-up read as failed while
the server went on to serve, as a chaos restart of postgres once did) is adopted by its
mark: `stop` stops it and `start` reuses it, instead of every later start finding its
port "taken by another process" (controlplane/stack/process.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from waiting import until_sync

from controlplane.settings import Settings
from controlplane.stack.process import ManagedProcess, _names
from controlplane.stack.single import SingleProcessService

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")

SLEEP = "import time; time.sleep(120)"
# A parent whose child carries the mark as well: the root of the two is ours to stop.
PARENT = (
    "import subprocess, sys; "
    f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}, sys.argv[1]]).wait()"
)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _process(tmp_path: Path) -> ManagedProcess:
    marker = str(tmp_path / "sleeper.data")
    return ManagedProcess("sleeper", tmp_path / "s.pid", tmp_path / "s.log", marker)


def test_stop_finds_and_stops_a_process_the_pid_file_lost(tmp_path: Path) -> None:
    proc = _process(tmp_path)
    pid = proc.start([sys.executable, "-c", SLEEP, proc.marker])
    try:
        proc.pid_file.unlink()
        assert proc.pid() is None
        assert proc.stop(timeout_s=10)
        assert not _running(pid)
        assert not proc.stop(timeout_s=10)  # nothing of ours is left
    finally:
        proc.stop(timeout_s=10)


def test_the_root_of_the_marked_processes_is_adopted(tmp_path: Path) -> None:
    proc = _process(tmp_path)
    root = proc.start([sys.executable, "-c", PARENT, proc.marker])
    try:
        until_sync(lambda: len(_marked(proc.marker)) == 2, 10, what="the marked child")
        proc.pid_file.write_text("999999999\n")  # stale: names nothing
        assert proc.adopt_orphan() == root
        assert proc.pid() == root
        assert proc.pid_file.read_text().strip() == str(root)
        assert proc.adopt_orphan() is None  # the pid file names it now
    finally:
        proc.stop(timeout_s=10)
    # The child the root left behind went with it (its process group).
    until_sync(lambda: not _marked(proc.marker), 10, what="the marked child to stop")


def _marked(marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline.replace("\0", " ") and _running(int(entry.name)):
                out.append(int(entry.name))
    return out


class _Sleeper(SingleProcessService):
    name = "sleeper"

    @property
    def endpoint(self) -> str:
        return "127.0.0.1:0"

    def install(self) -> None:
        pass

    def ports(self) -> list[int]:
        return []

    def prepare(self) -> list[str]:
        return [sys.executable, "-c", SLEEP, str(self.run_dir)]

    def health(self) -> None:
        pass


def test_start_reuses_a_serving_orphan_instead_of_starting_a_second(tmp_path: Path) -> None:
    service = _Sleeper(Settings(), tmp_path)
    assert service.start()
    first = service.process.pid()
    assert first is not None
    try:
        service.process.pid_file.unlink()
        assert not service.start()  # adopted, not started again
        assert service.process.pid() == first
        assert _marked(str(service.run_dir)) == [first]
    finally:
        service.stop()
    assert not _running(first)


def test_a_mark_is_a_whole_path_or_a_folder_of_one() -> None:
    assert _names("postgres -D /h/run/postgres/data", "/h/run/postgres")
    assert _names("sleep /h/run/postgres", "/h/run/postgres")
    assert _names("x /h/run/postgres2 y /h/run/postgres/data", "/h/run/postgres")
    assert not _names("postgres -D /h/run/postgres2/data", "/h/run/postgres")
    assert not _names("tail /h/run/postgres.log", "/h/run/postgres")
