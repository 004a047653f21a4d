"""`meridian policy ...` and `meridian db ...` through the CLI edge (exit statuses, shapes)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from harness.cli_schema import check_output

from controlplane.catalog import migrate
from controlplane.cli.main import run
from controlplane.policy.current import CompiledPolicy

DATA = Path(__file__).parent / "data"
EXAMPLE = DATA / "example.yaml"


def line_of(path: Path, needle: str) -> int:
    text = path.read_text()
    return text.count("\n", 0, text.index(needle)) + 1


def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(
        EXAMPLE.read_text().replace("priority: 100", "prioirty: 100").replace("rpo: 30s", "rpo: 0s")
    )
    return path


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "validate", str(EXAMPLE)]) == 0
    assert "valid: 2 policies, 3 regions" in capsys.readouterr().out


def test_validate_reports_file_line_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path)
    assert run(["policy", "validate", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    typo, rpo = line_of(path, "prioirty"), line_of(path, "rpo: 0s\n  failover:\n    mode: manual")
    assert (
        f"{path}:{typo}:3: error: unknown field 'prioirty' in spec; did you mean 'priority'?" in err
    )
    assert any(
        line.startswith(f"{path}:{rpo}:8: error: ") and "rpo must be > 0s" in line for line in err
    )
    assert err[-1].startswith("error: 2 problem(s) in 1 file(s)")


def test_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "validate", "-o", "json", str(EXAMPLE)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    path = bad_file(tmp_path)
    assert run(["policy", "validate", "--output", "json", str(path)]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert {
        "file": str(path),
        "line": line_of(path, "prioirty"),
        "column": 3,
        "message": "unknown field 'prioirty' in spec; did you mean 'priority'?",
    } in problems
    assert all(set(p) == {"file", "line", "column", "message"} for p in problems)


def test_missing_file_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "validate", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml:1:1: error: cannot read the file" in capsys.readouterr().err


def test_a_folder_is_one_problem_among_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # policy.md: all problems in all files are reported in one run, as a JSON list too.
    folder = tmp_path / "policies"
    folder.mkdir()
    path = bad_file(tmp_path)
    assert run(["policy", "validate", "-o", "json", str(folder), str(path)]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert {
        "file": str(folder),
        "line": 1,
        "column": 1,
        "message": "cannot read the file: it is a directory, not a regular file",
    } in problems
    assert sorted(p["file"] for p in problems) == sorted([str(folder), str(path), str(path)])


def test_schema_is_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["policy", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    kinds = json.dumps(schema)
    for word in ("Topology", "ReplicationPolicy", "Dataset", "residency", "failover"):
        assert word in kinds
    assert "class" in schema["$defs"]["PolicySpec"]["properties"]
    assert schema["$defs"]["PolicySpec"]["additionalProperties"] is False


def test_plan_apply_cycle(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--catalog", catalog_url, "policy"]
    assert run([*base, "plan", "-o", "json", str(EXAMPLE)]) == 2
    plan = json.loads(capsys.readouterr().out)
    check_output("policy_plan", plan)
    assert {
        "action": "add",
        "kind": "Region",
        "name": "us-east",
        "fields": {"jurisdiction": [None, "US"]},
    } in plan
    assert all(set(c) == {"action", "kind", "name", "fields"} for c in plan)
    assert run([*base, "apply", "--no-publish", "--yes", "-o", "json", str(EXAMPLE)]) == 0
    applied = json.loads(capsys.readouterr().out)
    assert applied["revision"] == 1 and applied["published"] is False
    assert run([*base, "plan", "-o", "json", str(EXAMPLE)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert run([*base, "apply", "--no-publish", "--yes", "-o", "table", str(EXAMPLE)]) == 0
    assert "nothing to do: revision 1 is current" in capsys.readouterr().out


def test_invalid_apply_changes_nothing(
    catalog_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--catalog", catalog_url, "policy"]
    assert run([*base, "apply", "--no-publish", "--yes", str(bad_file(tmp_path))]) == 1
    assert "nothing was changed" in capsys.readouterr().err
    assert run([*base, "plan", "-o", "json", str(EXAMPLE)]) == 2  # still everything to add
    assert run([*base, "plan", str(bad_file(tmp_path))]) == 1
    capsys.readouterr()
    # As JSON, stdout keeps plan's (and apply's) shape: nothing, the problems on stderr.
    for command in (["plan"], ["apply", "--no-publish", "--yes"]):
        assert run([*base, *command, "-o", "json", str(bad_file(tmp_path))]) == 1
        out, err = capsys.readouterr()
        assert out == "" and "error: unknown field 'prioirty'" in err, (command, out, err)


class TerminalInput(io.StringIO):
    """Typed answers, as if from a terminal."""

    def isatty(self) -> bool:
        return True


def test_apply_without_yes_aborts_on_no(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", TerminalInput("n\n"))
    apply = ["--catalog", catalog_url, "policy", "apply", "--no-publish", "-o", "json"]
    assert run([*apply, str(EXAMPLE)]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == "" and "add Region us-east: jurisdiction: None -> 'US'" in err
    assert run(["--catalog", catalog_url, "policy", "plan", "-o", "json", str(EXAMPLE)]) == 2
    assert json.loads(capsys.readouterr().out)  # nothing was applied
    monkeypatch.setattr("sys.stdin", TerminalInput("y\n"))
    assert run([*apply, str(EXAMPLE)]) == 0
    assert json.loads(capsys.readouterr().out)["revision"] == 1


def test_apply_refuses_a_non_terminal_without_yes(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review P3: a piped "y" does not apply; the refusal is one sentence on its own line."""
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert run(["--catalog", catalog_url, "policy", "apply", "--no-publish", str(EXAMPLE)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1] == (
        "error: applying 9 change(s) needs confirmation: pass --yes when not on a terminal; "
        "nothing was changed"
    )
    assert run(["--catalog", catalog_url, "policy", "plan", "-o", "json", str(EXAMPLE)]) == 2
    capsys.readouterr()
    # End of input at the prompt on a terminal: the error starts on a line of its own.
    monkeypatch.setattr("sys.stdin", TerminalInput(""))
    assert run(["--catalog", catalog_url, "policy", "apply", "--no-publish", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-2:] == ["apply these 9 change(s)? [y/N]:", "error: aborted."], err


def test_unmigrated_catalog_message(
    empty_catalog_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--catalog", empty_catalog_url, "policy", "plan", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run `meridian db upgrade`" in err


def test_unreachable_catalog_message(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/x"
    assert run(["policy", "plan", "--catalog", url, str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the catalog at") and "is unreachable" in err


def test_db_upgrade_and_current(
    empty_catalog_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # Alembic is configured in code, not from the working directory
    assert run(["db", "current", "--catalog", empty_catalog_url, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["current"] is None
    assert run(["db", "upgrade", "--catalog", empty_catalog_url, "-o", "table"]) == 0
    assert f"is at migration {migrate.head_revision()}" in capsys.readouterr().out
    assert run(["db", "current", "--catalog", empty_catalog_url, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True


def csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_validate_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Review P4: `-o csv` prints the problems as CSV on stdout, a header when none."""
    path = bad_file(tmp_path)
    assert run(["policy", "validate", "-o", "csv", str(path)]) == 1
    out, err = capsys.readouterr()
    rows = csv_rows(out)
    assert rows[0] == ["file", "line", "column", "message"]
    assert [str(path), str(line_of(path, "prioirty")), "3"] == rows[1][:3]
    assert len(rows) == 3 and err.startswith("error: 2 problem(s)")
    assert run(["policy", "validate", "-o", "csv", str(EXAMPLE)]) == 0
    assert csv_rows(capsys.readouterr().out) == [["file", "line", "column", "message"]]


def test_plan_and_apply_csv(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Review P4: plan and apply print CSV rows, and a header row when nothing changes."""
    base = ["--catalog", catalog_url, "policy"]
    assert run([*base, "plan", "-o", "csv", str(EXAMPLE)]) == 2
    rows = csv_rows(capsys.readouterr().out)
    assert rows[0] == ["action", "kind", "name", "fields"]
    assert ["add", "ReplicationPolicy", "checkpoints"] in [r[:3] for r in rows]
    assert run([*base, "apply", "--no-publish", "--yes", "-o", "csv", str(EXAMPLE)]) == 0
    rows = csv_rows(capsys.readouterr().out)
    assert rows[0] == ["revision", "digest", "action", "kind", "name", "fields"]
    assert len(rows) > 1 and all(r[0] == "1" for r in rows[1:])
    assert run([*base, "plan", "-o", "csv", str(EXAMPLE)]) == 0
    assert csv_rows(capsys.readouterr().out) == [["action", "kind", "name", "fields"]]
    assert run([*base, "apply", "--no-publish", "--yes", "-o", "csv", str(EXAMPLE)]) == 0
    assert len(csv_rows(capsys.readouterr().out)) == 1


def test_db_commands_csv(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Review P4: `db current` and `db upgrade` honour --output csv and json."""
    for command in ("current", "upgrade"):
        assert run(["db", command, "--catalog", catalog_url, "-o", "csv"]) == 0
        rows = csv_rows(capsys.readouterr().out)
        assert rows[0] == ["catalog", "current", "head", "up_to_date"]
        head = migrate.head_revision()
        assert rows[1][1:] == [head, head, "yes"] and head.isdigit()
        assert run(["db", command, "--catalog", catalog_url, "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["up_to_date"] is True


def test_schema_takes_output(capsys: pytest.CaptureFixture[str]) -> None:
    """Review P4: `policy schema -o json` works; a form it cannot print is one sentence."""
    assert run(["policy", "schema", "-o", "json"]) == 0
    assert "$schema" in json.loads(capsys.readouterr().out)
    assert run(["policy", "schema", "-o", "csv"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "use --output json" in err


@pytest.mark.integration
def test_apply_publishes_when_etcd_given(
    catalog_url: str, private_etcd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--catalog",
        catalog_url,
        "policy",
        "apply",
        "--yes",
        "--etcd",
        private_etcd,
        "-o",
        "json",
        str(EXAMPLE),
    ]
    assert run(argv) == 0
    assert json.loads(capsys.readouterr().out)["published"] is True
    assert run([*argv[:4], "--no-publish", *argv[4:]]) == 0
    assert json.loads(capsys.readouterr().out)["published"] is False


def test_apply_publishes_to_the_configured_etcd_by_default(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """policy.md: apply records the revision and publishes it to etcd, the default
    endpoint when none is named (as every other command reads it); not only when
    --etcd or MERIDIAN_ETCD is given. The publisher is faked: this is the CLI's edge."""
    published: list[tuple[list[tuple[str, int]], int]] = []

    class Recording:
        def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = 5.0) -> None:
            self.endpoints = list(endpoints)

        async def publish(self, policy: CompiledPolicy) -> None:
            published.append((self.endpoints, policy.revision))

    monkeypatch.delenv("MERIDIAN_ETCD", raising=False)
    monkeypatch.setattr("controlplane.policy.publisher.EtcdPolicyPublisher", Recording)
    argv = ["--catalog", catalog_url, "policy", "apply", "--yes", "-o", "json", str(EXAMPLE)]
    assert run(argv) == 0
    assert json.loads(capsys.readouterr().out)["published"] is True
    assert published == [([("127.0.0.1", 2379)], 1)]
    assert run([*argv[:4], "-o", "table", str(EXAMPLE), "--yes"]) == 0  # nothing to do...
    assert "is current and published it to etcd" in capsys.readouterr().out  # ...republished
    assert published[-1] == ([("127.0.0.1", 2379)], 1)


def test_replication_status_of_an_unknown_region_says_so(
    catalog_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--catalog", catalog_url]
    assert run([*base, "policy", "apply", "--no-publish", "--yes", str(EXAMPLE)]) == 0
    capsys.readouterr()
    # A typo must not read as "nothing to report" (an empty list, exit 0).
    assert run([*base, "replication", "status", "--region", "ap-south", "-o", "json"]) == 1
    err = capsys.readouterr().err
    assert (
        "unknown region 'ap-south': the catalog's regions are eu-central, eu-west, us-east" in err
    )


def test_a_migration_that_does_not_exist_is_one_clear_error(
    catalog_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["--catalog", catalog_url, "db", "upgrade", "--revision", "bogus"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --revision 'bogus': Can't locate revision")
    assert "internal error" not in err and migrate.head_revision() in err
    # A relative step is a target too (Alembic's own forms).
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert run(["--catalog", fresh, "db", "upgrade", "--revision=+1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["current"] == "0001"


def test_an_absurd_audit_limit_is_a_usage_error(
    catalog_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    limit = "99999999999999999999999"
    assert run(["--catalog", catalog_url, "audit", "transfers", "--limit", limit]) == 1
    err = capsys.readouterr().err
    assert "--limit" in err and "internal error" not in err
