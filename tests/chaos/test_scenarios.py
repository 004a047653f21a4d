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
import time
from collections.abc import Iterator

import pytest
from harness.cli_schema import check_output
from harness.controllers import meridian_argv

from chaos.scenarios import SCENARIOS, Scenario
from chaos.stack import PrivateStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 1400
DURATION = "30s"
# The data-plane scenarios (agents and replicators in four regions) cost twice the
# set-up and CPU: a shorter fault time keeps the suite's CI time bounded.
DATA_PLANE_DURATION = "12s"
BUDGET_S = 240  # set-up, 30 s of faults with their gaps, recovery, checks, teardown


Row = tuple[int, str, float, int, int, str]  # number, name, seconds, operations, acked, held


@pytest.fixture(scope="module")
def timings(request: pytest.FixtureRequest) -> Iterator[list[Row]]:
    """Every scenario's wall time, printed as one table after the module (CI's budget)."""
    rows: list[Row] = []
    yield rows
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not rows:
        return
    reporter.write_line("")
    reporter.write_line("chaos scenario times (s), seed 1400 + number:")
    reporter.write_line(f"{'#':>3}  {'scenario':<24} {'seconds':>8} {'ops':>6} {'acked':>6}  held")
    for number, name, seconds, ops, acked, held in sorted(rows):
        reporter.write_line(f"{number:>3}  {name:<24} {seconds:>8.1f} {ops:>6} {acked:>6}  {held}")
    reporter.write_line(f"     {'total':<24} {sum(r[2] for r in rows):>8.1f}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s.number}-{s.name}")
def test_scenario_holds_every_invariant(
    private_stack: PrivateStack, scenario: Scenario, timings: list[Row]
) -> None:
    seed = SEED + scenario.number
    started = time.monotonic()
    done = subprocess.run(
        [*meridian_argv(), "chaos", "run", scenario.name, "--seed", str(seed),
         "--duration", DATA_PLANE_DURATION if scenario.data_plane else DURATION,
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
    assert [r["scenario"] for r in results] == [scenario.name]
    result = results[0]
    held = all(v["held"] for v in result["invariants"])
    timings.append(
        (scenario.number, scenario.name, time.monotonic() - started, result["operations"],
         result["acked"], "yes" if held else "NO")
    )  # fmt: skip
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
