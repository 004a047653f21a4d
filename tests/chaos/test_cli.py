"""`meridian chaos list` and the refusals of `meridian chaos run` (no engine needed)."""

from __future__ import annotations

import json
import os
import subprocess

from harness.cli_schema import check_output
from harness.controllers import meridian_argv

from chaos.scenarios import SCENARIOS


def meridian(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*meridian_argv(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ},
    )


def test_list_as_json_matches_the_schema() -> None:
    done = meridian("chaos", "list", "--output", "json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    check_output("chaos_list", rows)
    assert [r["name"] for r in rows] == [s.name for s in SCENARIOS]
    assert all("no-split-brain" in r["invariants"] for r in rows)


def test_list_as_a_table_names_every_scenario() -> None:
    done = meridian("chaos", "list", "--output", "table")
    assert done.returncode == 0, done.stderr
    for s in SCENARIOS:
        assert s.name in done.stdout


def test_run_refuses_an_unknown_scenario_and_a_bad_duration() -> None:
    done = meridian("chaos", "run", "no-such-thing")
    assert done.returncode == 1
    assert "no chaos scenario named 'no-such-thing'" in done.stderr
    assert "owner-cut-from-etcd (2)" in done.stderr
    assert "Traceback" not in done.stderr
    done = meridian("chaos", "run", "2", "--duration", "soon")
    assert done.returncode == 1
    assert "--duration 'soon' is not a duration" in done.stderr
    done = meridian("chaos", "run", "2", "--duration", "3s")
    assert done.returncode == 1
    assert "too short" in done.stderr


def test_a_result_has_the_chaos_run_shape() -> None:
    from chaos.checkers.verdict import Verdict
    from chaos.runner import Result

    held = Verdict.of("no-split-brain", [], "fine")
    broken = Verdict.of("lost-acked-writes", [f"write w{i} absent" for i in range(7)])
    result = Result("owner-sigstop", 3, 500, 120, [held, broken], ["sigstop eu-west"], "/tmp/x")
    check_output("chaos_run", [result.as_json()])
    assert not result.held
    assert broken.detail is not None
    assert broken.detail.startswith("7 violation(s): write w0 absent")
    assert broken.detail.endswith("and 2 more")
