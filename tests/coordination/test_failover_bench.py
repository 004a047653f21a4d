"""The failover benchmark runs end to end in a tiny configuration (loopback only)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "failover_bench.py"


def test_tiny_benchmark_reports_its_table_and_no_split_brain(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(BENCH), "--trials", "1", "--datasets", "5"]
    argv += ["--switchovers", "2", "--ttl", "2", "--no-wan", "--json", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        # SIGINT, not the SIGKILL of subprocess.run's timeout: asyncio.run cancels the
        # bench's task, so its `finally` stops the etcd cluster it started (members in
        # sessions of their own, which a kill of the bench alone would leave running).
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"the bench did not end within 180 s: {stderr[-2000:]}")
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| loopback | 1 x 5 | 2 s |" in done.stdout
    [run] = json.loads(out.read_text())
    assert run["split_brain"] == 0
    assert 0 < run["failover_p95_s"] <= 2 + 1.5
    assert run["switchover_p95_s"] < 1
