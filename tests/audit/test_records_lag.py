"""How far behind each region's records are (controlplane/cli/records_lag.py): the
largest of its agents' published figures; unknown (and said so) when etcd cannot say;
`replication status` carries it per row and still answers without etcd."""

from __future__ import annotations

import json

import pytest
from harness.cli_schema import check_output

from controlplane.cli.main import run
from controlplane.cli.records_lag import RecordsLag, lag_from


def registration(region: str, behind: object) -> bytes:
    return json.dumps({"id": f"{region}-a", "region": region, "records_behind_s": behind}).encode()


def test_a_region_lags_as_its_furthest_behind_agent() -> None:
    values = [
        registration("eu-west", 0),
        registration("eu-west", 42),
        registration("eu-central", 0),
        registration("us-east", True),  # not a number: skipped
        registration("us-east", -1),
        json.dumps({"id": "old", "region": "eu-north"}).encode(),  # predates the field
        b"not json",
    ]
    assert lag_from(values) == {"eu-west": 42.0, "eu-central": 0.0}


def test_what_lags_is_said_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    RecordsLag({"eu-west": 42.0, "eu-central": 0.0}).say()
    err = capsys.readouterr().err
    assert err == (
        "note: eu-west's records in the catalog are 42 s behind; what happened there since "
        "may not show yet\n"
    )
    RecordsLag(None, "etcd at 127.0.0.1:1 did not answer").say()
    assert capsys.readouterr().err == "records lag unknown: etcd at 127.0.0.1:1 did not answer\n"


def test_replication_status_answers_without_etcd_and_says_the_lag_is_unknown(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MERIDIAN_ETCD", "127.0.0.1:1")
    assert run(["--catalog", catalog_url, "replication", "status", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    check_output("replication_status", rows)
    assert all(r["records_behind_s"] is None for r in rows)
    assert err.startswith("records lag unknown: etcd at 127.0.0.1:1 did not answer")
