"""The Grafana dashboard: built with Grafana's own types, current, and its queries listed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from deploy_helpers import DEPLOY
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from controlplane.errors import InvalidInputError
from controlplane.observability import DASHBOARD_PATH
from controlplane.observability.dashboard import panel_queries

BUILD = DEPLOY / "grafana" / "build.py"


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_build", BUILD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_json_is_what_the_builder_makes() -> None:
    assert DASHBOARD_PATH.read_text() == builder().render(), (
        "deploy/grafana/meridian.json is stale: run python deploy/grafana/build.py"
    )


def test_json_round_trips_through_grafanas_dashboard_model() -> None:
    document = json.loads(DASHBOARD_PATH.read_text())
    again = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(document)))
    assert again == document, "a field the schema does not know would be lost here"


def test_panels_cover_the_issue() -> None:
    titles = " | ".join(query.panel.lower() for query in panel_queries())
    topics = ("regions", "owned", "lag", "rpo", "logical against wire", "refusals", "failovers")
    for topic in topics:
        assert topic in titles, topic
    exprs = " ".join(query.expr for query in panel_queries())
    assert "meridian_dataset_rpo_seconds" in exprs or "meridian:dataset_rpo_seconds" in exprs


def test_panel_queries_list_every_target_and_need_no_variables() -> None:
    document = json.loads(DASHBOARD_PATH.read_text())
    targets = sum(len(p.get("targets") or []) for p in document["panels"] if p["type"] != "row")
    queries = panel_queries()
    assert len(queries) == targets >= 8
    for query in queries:
        assert "$" not in query.expr, f"{query.panel}: a variable would not run as it is"
        assert query.ref_id


def test_a_panel_without_a_query_is_refused(tmp_path: Path) -> None:
    document = json.loads(DASHBOARD_PATH.read_text())
    document["panels"][1]["targets"] = []
    broken = tmp_path / "dashboard.json"
    broken.write_text(json.dumps(document))
    with pytest.raises(InvalidInputError, match="has no query"):
        panel_queries(broken)
