"""The Prometheus rules: valid, their promtool unit tests pass, and they name real metrics."""

from __future__ import annotations

import re
from pathlib import Path

from deploy_helpers import DEPLOY, explain, run_tool
from ruamel.yaml import YAML

from agents.metrics import AgentMetrics
from controlplane.controller.metrics import ControllerMetrics
from controlplane.observability.dashboard import panel_queries

RULES = DEPLOY / "prometheus" / "rules" / "meridian.rules.yml"
UNIT_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))

# dataplane.md's *Metrics* names, the replicator's (not on every branch yet), and the rpo
# gauge the lag alert assumes every replicator exports.
SPEC_METRICS = {
    "meridian_agent_objects",
    "meridian_agent_bytes_stored",
    "meridian_transfer_bytes_total",
    "meridian_transfer_seconds",
    "meridian_replication_lag_seconds",
    "meridian_replication_pending",
    "meridian_replication_failed_total",
    "meridian_residency_refused_total",
    "meridian_stale_epoch_refused_total",
    "meridian_dlq_total",
    "meridian_records_behind_seconds",
    "meridian_dataset_rpo_seconds",
}


def known_metrics() -> set[str]:
    names = set(SPEC_METRICS)
    for registry in (AgentMetrics("r").registry, ControllerMetrics("r").registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            if family.type == "histogram":  # a labelled one has no samples until observed
                names.update(family.name + part for part in ("_bucket", "_sum", "_count"))
    return names


def rules() -> list[dict[str, str]]:
    document = YAML(typ="safe", pure=True).load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_rules_pass_promtool_check(promtool: Path) -> None:
    done = run_tool([promtool, "check", "rules", RULES])
    assert done.returncode == 0, explain(done)
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_rule_unit_tests_pass(promtool: Path) -> None:
    assert UNIT_TESTS, "no promtool unit tests in deploy/prometheus/tests"
    done = run_tool([promtool, "test", "rules", *UNIT_TESTS])
    assert done.returncode == 0, explain(done)
    assert "SUCCESS" in done.stdout


def test_alerts_cover_the_issue() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert {
        "MeridianReplicationLagOverRpo",
        "MeridianReplicationFailed",
        "MeridianResidencyRefused",
        "MeridianRegionWithoutLivenessLease",
        "MeridianRecordsBehind",
        "MeridianOutboxBehind",
    } <= alerts
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"page", "warning"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]


def test_rules_and_dashboard_name_only_real_metrics() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    exprs = [rule["expr"] for rule in rules()] + [query.expr for query in panel_queries()]
    known = known_metrics() | recorded
    for expr in exprs:
        for name in re.findall(r"\bmeridian[_:][a-z0-9_:]+", expr):
            assert name in known, f"{name} in {expr!r} is no metric Meridian exports or records"


def test_every_dashboard_query_parses_and_returns_data(promtool: Path, tmp_path: Path) -> None:
    """Offline stand-in for the demo's live check: each panel query, as an alert that
    fires when the query returns anything, over series shaped like the demo's."""
    queries = panel_queries()
    alerts = [
        {"alert": f"Panel{index}", "expr": f"count({query.expr}) > 0"}
        for index, query in enumerate(queries)
    ]
    yaml = YAML(typ="safe", pure=True)
    panels = tmp_path / "panels.rules.yml"
    with panels.open("w") as handle:
        yaml.dump({"groups": [{"name": "panels", "rules": alerts}]}, handle)
    done = run_tool([promtool, "check", "rules", panels])
    assert done.returncode == 0, explain(done)

    test = {
        "rule_files": [str(RULES), str(panels)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": demo_like_series(),
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": rule["alert"],
                        "exp_alerts": [{"exp_labels": {}, "exp_annotations": {}}],
                    }
                    for rule in alerts
                ],
            }
        ],
    }
    unit = tmp_path / "panels.test.yml"
    with unit.open("w") as handle:
        yaml.dump(test, handle)
    done = run_tool([promtool, "test", "rules", unit])
    failing = [
        f"{query.panel} ({query.ref_id}): {query.expr}"
        for index, query in enumerate(queries)
        if f"alertname: Panel{index}," in done.stdout
    ]
    assert done.returncode == 0, f"panel queries with no data: {failing}\n{explain(done)}"


def demo_like_series() -> list[dict[str, str]]:
    def target(component: str, region: str) -> str:
        return f'region="{region}", component="{component}", job="{component}"'

    transfer, refused = "meridian_transfer_bytes_total", "meridian_residency_refused_total"
    rows: list[tuple[str, str]] = []
    for region in ("eu-west", "eu-central", "us-east"):
        c, a, r = (
            target("controller", region),
            target("agent", region),
            target("replicator", region),
        )
        rows += [
            (f"meridian_controller_info{{{c}}}", "1x60"),
            (f"meridian_controller_active{{{c}}}", "1x60"),
            (f"meridian_controller_datasets_owned{{{c}}}", "1x60"),
            (f"meridian_controller_failovers_total{{{c}}}", "0x20 1x40"),
            (f"meridian_controller_fenced_writes_total{{{c}}}", "0x60"),
            (f"meridian_records_behind_seconds{{{a}}}", "0x60"),
            (f'{transfer}{{kind="logical", direction="in", {a}}}', "0+9000x60"),
            (f'{transfer}{{kind="wire", direction="in", {a}}}', "0+900x60"),
            (f'{refused}{{dataset="ckpt/demo", direction="received", {a}}}', "0x30 1x30"),
            (f'meridian_dataset_rpo_seconds{{dataset="corpus/demo", {r}}}', "30x60"),
            (f'meridian_replication_lag_seconds{{dataset="corpus/demo", {r}}}', "2x60"),
            (f'meridian_replication_pending{{dataset="corpus/demo", {r}}}', "3x60"),
            (f'meridian_agent_request_seconds_bucket{{call="Put", le="0.01", {a}}}', "0+8x60"),
            (f'meridian_agent_request_seconds_bucket{{call="Put", le="0.1", {a}}}', "0+10x60"),
            (f'meridian_agent_request_seconds_bucket{{call="Put", le="+Inf", {a}}}', "0+10x60"),
        ]  # fmt: skip
        push = "meridian_critical_push_seconds_bucket"
        for stage in ("queued", "call"):
            for le, values in (("0.025", "0+6x60"), ("0.05", "0+9x60"), ("+Inf", "0+10x60")):
                where = f'to_region="eu-north", stage="{stage}", le="{le}", {a}'
                rows.append((f"{push}{{{where}}}", values))
    return [{"series": series, "values": values} for series, values in rows]
