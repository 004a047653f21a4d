"""`meridian chaos list` and the refusals of `meridian chaos run` (no engine needed)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
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


def test_run_prints_a_table_per_scenario_and_fails_on_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run itself faked (the suite is exercised for real in test_scenarios.py)."""
    from typer.testing import CliRunner

    import chaos.suite
    from chaos.checkers.verdict import Verdict
    from chaos.runner import Result
    from controlplane.cli.main import app

    calls: list[tuple[list[str], int, float]] = []

    def fake(_settings: object, chosen: list[object], seed: int, duration_s: float, **_: object):
        calls.append(([s.name for s in chosen], seed, duration_s))  # type: ignore[attr-defined]
        return [
            Result("owner-isolated", seed, 300, 90, [Verdict.of("no-split-brain", [])]),
            Result("owner-sigstop", seed + 1, 310, 80, [Verdict.of("residency", ["copy x"])]),
        ]

    monkeypatch.setattr(chaos.suite, "run_suite", fake)
    done = CliRunner().invoke(
        app, ["chaos", "run", "1", "owner-sigstop", "--seed", "5", "--duration", "1m",
              "--output", "table"],
    )  # fmt: skip
    assert calls == [(["owner-isolated", "owner-sigstop"], 5, 60.0)]
    assert done.exit_code == 1
    assert "owner-isolated (seed 5): 300 operations, 90 acked writes" in done.output
    assert "owner-sigstop (seed 6): 310 operations, 80 acked writes" in done.output
    assert "owner-sigstop failed with seed 6" in done.output


def test_a_duration_is_written_as_the_policy_writes_one() -> None:
    from controlplane.cli.chaos import parse_duration

    assert [parse_duration(t) for t in ("45s", "2m", "1h", "1500ms", "30")] == [
        45.0,
        120.0,
        3600.0,
        1.5,
        30.0,
    ]


def test_run_as_csv_has_one_header_and_a_row_per_scenario_and_invariant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import csv
    import io

    from typer.testing import CliRunner

    import chaos.suite
    from chaos.checkers.verdict import Verdict
    from chaos.runner import Result
    from controlplane.cli.main import app

    def fake(_settings: object, _chosen: object, seed: int, _duration_s: float, **_: object):
        return [
            Result("owner-isolated", seed, 300, 90, [Verdict.of("no-split-brain", [])]),
            Result(
                "owner-sigstop",
                seed + 1,
                310,
                80,
                [Verdict.of("no-split-brain", []), Verdict.of("residency", ["copy x"])],
            ),
        ]

    monkeypatch.setattr(chaos.suite, "run_suite", fake)
    done = CliRunner().invoke(
        app, ["chaos", "run", "--seed", "5", "--duration", "1m", "--output", "csv"]
    )
    assert done.exit_code == 1, done.stderr
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert rows[0] == ["scenario", "seed", "operations", "acked", "invariant", "held", "detail"]
    assert [r[0] for r in rows[1:]] == ["owner-isolated", "owner-sigstop", "owner-sigstop"]
    assert rows[3][1:6] == ["6", "310", "80", "residency", "no"]
