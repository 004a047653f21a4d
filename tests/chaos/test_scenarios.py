"""CI's chaos run: every implemented scenario with a fixed seed, through the CLI.

One `meridian chaos run` per scenario (seed 1400 + its number) on the session's
private stack, its JSON checked against the CLI schema; an invariant that did
not hold fails that scenario's test with its seed (to re-run it) and the
offending operations.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from harness.cli_schema import check_output
from harness.controllers import meridian_argv

from chaos.scenarios import SCENARIOS, Scenario
from chaos.stack import PrivateStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 1400
DURATION = "30s"
BUDGET_S = 240  # set-up, 30 s of faults with their gaps, recovery, checks, teardown


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s.number}-{s.name}")
def test_scenario_holds_every_invariant(private_stack: PrivateStack, scenario: Scenario) -> None:
    seed = SEED + scenario.number
    done = subprocess.run(
        [*meridian_argv(), "chaos", "run", scenario.name, "--seed", str(seed),
         "--duration", DURATION, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=BUDGET_S,
        check=False,
        env={**os.environ},
    )  # fmt: skip
    assert done.stdout, f"no output; stderr: {done.stderr[-2000:]}"
    results = json.loads(done.stdout)
    check_output("chaos_run", results)
    assert [r["scenario"] for r in results] == [scenario.name]
    result = results[0]
    assert result["seed"] == seed
    failures = [f"{v['name']}: {v['detail']}" for v in result["invariants"] if not v["held"]]
    assert not failures, (
        f"{scenario.name} failed (re-run: meridian chaos run {scenario.name} --seed {seed}; "
        f"history in {result.get('run_dir')}):\n" + "\n".join(failures)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [v["name"] for v in result["invariants"]] == list(scenario.invariants)
    assert result["operations"] >= 200, result
    assert result["acked"] >= 50, result
