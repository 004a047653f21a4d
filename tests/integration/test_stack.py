"""`meridian stack`: a second, private stack on other ports, brought up and down for real."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cli_schema import check_output

from controlplane.cli import main
from controlplane.errors import StackError
from controlplane.loopback import free_block, free_port
from controlplane.settings import Settings, load_settings
from controlplane.stack.etcd import put_and_get
from controlplane.stack.manager import Stack

pytestmark = pytest.mark.integration

# The etcd members' client and peer ports, from the stack's base port.
ETCD_OFFSETS = (0, 1, 10, 11, 20, 21)


@pytest.fixture
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    # The shared engine cache keeps this fast; the run folder is private to the test.
    shared = load_settings()
    monkeypatch.setenv("MERIDIAN_HOME", str(tmp_path / "home"))
    # Handed out as every test's daemons' are (below the ephemeral range, not given
    # twice): fixed ports here once met an earlier test's listener on the same number.
    monkeypatch.setenv("MERIDIAN_STACK_ETCD_PORT", str(free_block(ETCD_OFFSETS)))
    monkeypatch.setenv("MERIDIAN_STACK_TOXIPROXY_PORT", str(free_port()))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "cache").symlink_to(shared.cache_dir.resolve())
    settings = load_settings()
    yield settings
    Stack(settings).down()


def _status(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, object]]:
    capsys.readouterr()
    assert main.run(["stack", "status", "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    check_output("stack_status", rows)
    return {row["service"]: row for row in rows}


def test_up_status_down_cycle(private_home: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    stack = Stack(private_home)
    report = stack.up(only=("etcd", "toxiproxy"))
    assert report.started == ["etcd", "toxiproxy"]
    put_and_get(f"http://127.0.0.1:{private_home.stack_etcd_port}")

    again = stack.up(only=("etcd", "toxiproxy"))
    assert again.started == [] and again.already_up == ["etcd", "toxiproxy"]

    rows = _status(capsys)
    assert rows["etcd"]["state"] == "up" and rows["toxiproxy"]["state"] == "up"
    assert rows["etcd"]["endpoint"] == f"127.0.0.1:{private_home.stack_etcd_port}"
    pids = [int(str(rows[name]["pid"])) for name in ("etcd", "toxiproxy")]
    assert Path(str(rows["etcd"]["log"])).exists()

    assert main.run(["stack", "down"]) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    assert all(row["state"] == "down" for row in _status(capsys).values())
    assert main.run(["stack", "down"]) == 0  # idempotent
    assert "nothing was running" in capsys.readouterr().out


def test_taken_port_is_one_sentence_and_leaves_nothing_running(
    private_home: Settings,
) -> None:
    taken = private_home.stack_toxiproxy_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with pytest.raises(StackError, match=f"port {taken} on 127.0.0.1 is already taken"):
            Stack(private_home).up(only=("etcd", "toxiproxy"))
    # etcd was started by this call before toxiproxy failed: it must have been stopped again.
    assert all(row.state == "down" for row in Stack(private_home).status())


def test_three_member_etcd(private_home: Settings) -> None:
    stack = Stack(private_home)
    stack.up(etcd_members=3, only=("etcd",))
    rows = [r for r in stack.status() if r.service.startswith("etcd")]
    assert [r.state for r in rows] == ["up", "up", "up"]
    base = private_home.stack_etcd_port
    for port in (base, base + 10, base + 20):
        put_and_get(f"http://127.0.0.1:{port}")
    with pytest.raises(StackError, match="already running with 3 member"):
        stack.up(etcd_members=1, only=("etcd",))


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_no_process_of_ours_survives_down(private_home: Settings) -> None:
    stack = Stack(private_home)
    stack.up(only=("toxiproxy",))
    pid = next(r.pid for r in stack.status() if r.service == "toxiproxy")
    assert pid is not None
    stack.down()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_etcd_data_of_another_size_is_refused_not_split(private_home: Settings) -> None:
    stack = Stack(private_home)
    stack.up(only=("etcd",))
    stack.down()
    # Restarting 1-member data as 3 members would make two clusters, each healthy alone.
    with pytest.raises(StackError, match="holds a 1-member cluster"):
        stack.up(etcd_members=3, only=("etcd",))
    assert all(row.state == "down" for row in stack.status())
    again = stack.up(only=("etcd",))  # no flag: as last started
    assert again.started == ["etcd"]
