"""CI's chaos run: every scenario with fixed seeds, through the CLI.

Scenarios needing the same kind of world run in one `meridian chaos run` (so on
one world, see chaos.runner): the control-plane ones, the data-plane ones, and
clock skew (whose world has a skewed region). Seeds are 1400 plus the group's
offset plus the scenario's index in its group, printed with each result. Each
scenario is its own test: its JSON checked against the CLI schema; an invariant
that did not hold fails it with its seed (to re-run it) and the offending
operations. The module prints every scenario's time as a table at its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.cli_schema import check_output
from harness.controllers import meridian_argv

from chaos.scenarios import SCENARIOS, Scenario
from chaos.stack import PrivateStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# name: (first seed, --duration, scenario numbers in run order)
GROUPS: dict[str, tuple[int, str, list[int]]] = {
    # 30 s of faults each, as issue 14 asks: about 810 s of scenarios and 120 s of
    # worlds on this 2-core machine while other work loaded it (load 10-19).
    "control": (1400, "30s", [1, 2, 3, 4, 6, 12]),
    "data": (1420, "30s", [5, 7, 8, 9, 10, 11]),
    "skew": (1440, "30s", [13]),
}
# Bugs the suite found that are not fixed on this branch: the scenario's test is an
# expected failure while exactly these invariants fail (any other failing fails it).
KNOWN: dict[str, tuple[set[str], str]] = {}
WORLD_S = 240  # a world's set-up and teardown on a loaded machine
BUDGET_S = 200  # per scenario: 30 s of faults with their gaps, recovery, checks, its share
Row = tuple[int, str, float, float, int, int, str]  # number, name, s, world s, ops, acked, held


def group_of(scenario: Scenario) -> str:
    return next(name for name, (_, _, numbers) in GROUPS.items() if scenario.number in numbers)


def test_every_scenario_is_in_one_group() -> None:
    numbers = sorted(n for _, _, ns in GROUPS.values() for n in ns)
    assert numbers == sorted(s.number for s in SCENARIOS)


def run_bounded(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run the CLI; past `timeout_s`, SIGINT it first (it stops its world's daemons, which
    a SIGKILL would leave running), then kill it."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err = f"{err}\ntimed out after {timeout_s:g} s"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class Groups:
    """Each group's CLI run, made when its first scenario's test asks for it."""

    def __init__(self) -> None:
        self.done: dict[str, tuple[subprocess.CompletedProcess[str], dict[str, Any]]] = {}
        self.rows: list[Row] = []

    def run(self, name: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        if name not in self.done:
            seed, duration, numbers = GROUPS[name]
            argv = [*meridian_argv(), "chaos", "run", *map(str, numbers), "--seed", str(seed),
                    "--duration", duration, "--output", "json"]  # fmt: skip
            done = run_bounded(argv, WORLD_S + BUDGET_S * len(numbers))
            results: dict[str, Any] = {}
            if done.stdout:
                results = {r["scenario"]: r for r in json.loads(done.stdout)}
            self.done[name] = (done, results)  # cached before any check: run once only
            if done.stdout:
                check_output("chaos_run", list(results.values()))
        return self.done[name]


@pytest.fixture(scope="module")
def groups(request: pytest.FixtureRequest) -> Iterator[Groups]:
    """The group runs, and every scenario's wall time printed as one table after them."""
    g = Groups()
    yield g
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not g.rows:
        return
    reporter.write_line("")
    reporter.write_line("chaos scenario times (s; world: its share of the world's set-up):")
    head = f"{'#':>3}  {'scenario':<24} {'own':>7} {'world':>7} {'ops':>6} {'acked':>6}  held"
    reporter.write_line(head)
    for number, name, own, world, ops, acked, held in sorted(g.rows):
        reporter.write_line(
            f"{number:>3}  {name:<24} {own:>7.1f} {world:>7.1f} {ops:>6} {acked:>6}  {held}"
        )
    total = sum(r[2] + r[3] for r in g.rows)
    reporter.write_line(f"     {'total':<24} {total:>15.1f}")


# The first scenario of a group waits for the whole group's run (its CLI has its own
# bound, BUDGET_S per scenario): above pytest's default 600 s.
@pytest.mark.timeout(WORLD_S + BUDGET_S * 6 + 300)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s.number}-{s.name}")
def test_scenario_holds_every_invariant(
    private_stack: PrivateStack, scenario: Scenario, groups: Groups
) -> None:
    started = time.monotonic()
    done, results = groups.run(group_of(scenario))
    assert results, f"no output; stderr: {done.stderr[-2000:]}"
    assert scenario.name in results, f"{scenario.name} did not run: {done.stderr[-2000:]}"
    result = results[scenario.name]
    held = all(v["held"] for v in result["invariants"])
    groups.rows.append(
        (scenario.number, scenario.name, result["elapsed_s"], result["world_s"],
         result["operations"], result["acked"], "yes" if held else "NO")
    )  # fmt: skip
    assert time.monotonic() - started < BUDGET_S * 10  # bounded (the run has its timeout)
    seed = result["seed"]
    failures = [f"{v['name']}: {v['detail']}" for v in result["invariants"] if not v["held"]]
    failed = {v["name"] for v in result["invariants"] if not v["held"]}
    known, why = KNOWN.get(scenario.name, (set(), ""))
    if failed and failed <= known:
        pytest.xfail(f"known bug: {why} (seed {seed}): " + "; ".join(failures)[:1500])
    assert not failures, (
        f"{scenario.name} failed (re-run: meridian chaos run {scenario.name} --seed {seed}; "
        f"history in {result.get('run_dir')}):\n" + "\n".join(failures)
    )
    assert [v["name"] for v in result["invariants"]] == list(scenario.invariants)
    assert result["operations"] >= 200, result
    assert result["acked"] >= 50, result
    if all(all(v["held"] for v in r["invariants"]) for r in results.values()):
        assert done.returncode == 0, done.stderr[-2000:]
