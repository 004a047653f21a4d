"""The failover benchmark runs end to end in a tiny configuration (loopback only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "failover_bench.py"


def test_tiny_benchmark_reports_its_table_and_no_split_brain(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--trials",
            "1",
            "--datasets",
            "5",
            "--switchovers",
            "2",
            "--ttl",
            "2",
            "--no-wan",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| loopback | 1 x 5 | 2 s |" in done.stdout
    [run] = json.loads(out.read_text())
    assert run["split_brain"] == 0
    assert 0 < run["failover_p95_s"] <= 2 + 1.5
    assert run["switchover_p95_s"] < 1
