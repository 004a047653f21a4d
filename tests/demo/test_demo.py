"""`meridian demo --scale small` as a user runs it: a real process on the real stack.

One run (it takes minutes) checks three things:
- it exits 0 and every step's check held, in its `--output json` list;
- while it is kept running (`--keep`), every panel query of the Grafana dashboard
  (deploy/grafana/meridian.json) returns data from the Prometheus it started;
- after SIGTERM it has stopped everything it started: no process, proxy or port left.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from harness.children import popen
from waiting import WaitTimeoutError, until_sync

from controlplane.observability.dashboard import panel_queries
from controlplane.settings import Settings
from controlplane.stack.prometheus import PrometheusClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEMO_DEADLINE_S = 480  # the budget is 3 minutes; a loaded CI machine gets more
PANEL_DEADLINE_S = 90
STOP_DEADLINE_S = 60
STEPS = {"1 checkpoints", "2 corpus", "3 residency", "4 failover", "5 return", "6 audit"}
# spec/cli-output.schema.json has no definition for `demo` yet; this is its shape.
ROWS_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["step", "check", "held", "detail"],
        "properties": {
            "step": {"type": "string"},
            "check": {"type": "string"},
            "held": {"type": "boolean"},
            "detail": {"type": "string"},
        },
    },
}


def _meridian() -> list[str]:
    script = Path(sys.executable).with_name("meridian")
    return [str(script)] if script.exists() else [sys.executable, "-m", "controlplane.cli.entry"]


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (the demo's daemons and Prometheus)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    for _ in range(10):  # bounded depth: the demo's tree is two levels deep
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        if not frontier:
            break
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has stopped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment names `text`."""
    hits = []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            if text.encode() in blob and _alive(int(proc.name)):
                hits.append(int(proc.name))
    return hits


def _port_free(address: str) -> bool:
    """Nothing listens there (a closed connection's TIME_WAIT may linger: allowed)."""
    host, _, port = address.rpartition(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError:
            return False
    return True


def _wait_kept(proc: subprocess.Popen[bytes], err: Path) -> dict[str, Any]:

    def kept_or_exited() -> bool:
        return proc.poll() is not None or any(e.get("event") == "demo_kept" for e in _events(err))

    with contextlib.suppress(WaitTimeoutError):  # the failure below says more
        until_sync(kept_or_exited, DEMO_DEADLINE_S, "the demo to reach --keep", step_s=0.5)
    kept = [e for e in _events(err) if e.get("event") == "demo_kept"]
    if kept:
        return kept[0]
    tail = "\n".join(err.read_text(errors="replace").splitlines()[-30:])
    pytest.fail(f"the demo did not reach --keep (exit {proc.poll()}):\n{tail}")


def _a_number(sample: dict[str, Any]) -> bool:
    """Whether a sample of an instant vector holds a finite value: a quantile of no
    observations, or a ratio of two zero rates, is NaN, which a panel draws as nothing."""
    value = sample.get("value")
    try:
        return isinstance(value, list) and math.isfinite(float(value[1]))
    except (IndexError, TypeError, ValueError):
        return False


def _panels_with_data(prometheus: PrometheusClient) -> list[str]:
    """Wait until every panel query returns data; the ones that never did."""
    queries = panel_queries()
    assert len(queries) >= 8  # the dashboard's panels, each with its query
    empty = {q.expr: q for q in queries}

    def all_have_data() -> bool:
        for expr in list(empty):
            if any(_a_number(sample) for sample in prometheus.query(expr)):
                del empty[expr]
        return not empty

    with contextlib.suppress(WaitTimeoutError):  # the caller's assertion names them
        until_sync(all_have_data, PANEL_DEADLINE_S, "every panel to show data", step_s=1)
    return [f"{q.panel} [{q.ref_id}]: {q.expr}" for q in empty.values()]


def test_the_small_demo_holds_every_step_feeds_every_panel_and_stops_all_it_started(
    stack_settings: Settings, tmp_path: Path
) -> None:
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = popen(
            [*_meridian(), "demo", "--scale", "small", "--keep", "--output", "json"],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    started = time.monotonic()
    try:
        kept = _wait_kept(proc, err)
        seconds = time.monotonic() - started
        rows = json.loads(out.read_text())
        jsonschema.validate(rows, ROWS_SCHEMA)
        failed = [f"{r['step']}: {r['check']} ({r['detail']})" for r in rows if not r["held"]]
        assert not failed, failed
        assert {r["step"] for r in rows} == STEPS
        print(f"small demo: every check held in {seconds:.0f} s")  # the measure, with -s

        prometheus = PrometheusClient(kept["prometheus"])
        up = prometheus.targets_up()
        assert up and all(up.values()), up
        assert _panels_with_data(prometheus) == []

        children = _descendants(proc.pid)
        assert len(children) >= 11  # 4 agents, 4 controllers, 3 replicators, Prometheus
        addresses = [kept["prometheus"].removeprefix("http://")]
        addresses += [a for group in kept["metrics"].values() for a in group]
        addresses += list(kept["agents"].values())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_DEADLINE_S) == 0
        assert [p for p in children if _alive(p)] == []
        assert _mentioning(kept["run_dir"]) == []
        assert [a for a in addresses if not _port_free(a)] == []
        proxies = httpx.get(f"http://{stack_settings.toxiproxy}/proxies", timeout=5).json()
        assert [name for name in proxies if name.startswith("meridian-demo-")] == []
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(STOP_DEADLINE_S)
