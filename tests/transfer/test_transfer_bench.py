"""The transfer benchmark runs end to end at its --quick size (a smoke run: the
figures are not checked, only that every row is produced)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer_bench.py"


@pytest.mark.integration
@pytest.mark.slow
def test_the_benchmark_prints_its_table(toxiproxy_url: str, tmp_path: Path) -> None:
    port = toxiproxy_url.rsplit(":", 1)[1]
    env = {**os.environ, "MERIDIAN_STACK_TOXIPROXY_PORT": port}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for row in (
        "checkpoint 2% rewritten",
        "no basis, loopback",
        "files of 4 KiB",
        "Sync cut at 50%",
        "receiver agent",
    ):
        assert row in done.stdout
    assert "x (target <= 1.1x)" in done.stdout
