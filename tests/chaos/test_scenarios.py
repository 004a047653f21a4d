"""CI's chaos run: every implemented scenario with a fixed seed, through the CLI.

One `meridian chaos run` of all scenarios on the session's private stack, its
JSON checked against the CLI schema; any invariant that did not hold fails the
test with the scenario, its seed (to re-run it) and the offending operations.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from harness.cli_schema import check_output
from harness.controllers import meridian_argv

from chaos.scenarios import SCENARIOS
from chaos.stack import PrivateStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 1400
DURATION = "30s"
BUDGET_S = 30 + 100 * len(SCENARIOS)  # set-up, faults, recovery and checks, each


def test_every_scenario_holds_every_invariant(private_stack: PrivateStack) -> None:
    names = [s.name for s in SCENARIOS]
    done = subprocess.run(
        [*meridian_argv(), "chaos", "run", *names, "--seed", str(SEED), "--duration", DURATION,
         "--output", "json"],
        capture_output=True,
        text=True,
        timeout=BUDGET_S,
        check=False,
        env={**os.environ},
    )  # fmt: skip
    assert done.stdout, f"no output; stderr: {done.stderr[-2000:]}"
    results = json.loads(done.stdout)
    check_output("chaos_run", results)
    assert [r["scenario"] for r in results] == names
    failures = [
        f"{r['scenario']} (re-run: meridian chaos run {r['scenario']} --seed {r['seed']}): "
        f"{v['name']}: {v['detail']} [history in {r.get('run_dir')}]"
        for r in results
        for v in r["invariants"]
        if not v["held"]
    ]
    assert not failures, "\n".join(failures)
    assert done.returncode == 0, done.stderr[-2000:]
    for r in results:
        assert r["operations"] >= 200, r
        assert r["acked"] >= 50, r
