"""Build deploy/grafana/meridian.json with Grafana's own types (grafana-foundation-sdk).

The dashboard is code so that its JSON follows Grafana's schema by construction; the
committed JSON is this script's output, and tests/deploy/test_grafana.py checks that it
is current. Run `python deploy/grafana/build.py` after changing a panel.

Every query runs as it is, with no dashboard variables, so a live test can execute each
against Prometheus (controlplane.observability.dashboard.panel_queries lists them).
Series carry `region` and `component` target labels (see deploy/prometheus/rules/).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

OUT = Path(__file__).with_name("meridian.json")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def series(title: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12)
    for target in queries:
        panel = panel.with_target(target)
    return panel


def build() -> dashboard.Dashboard:
    regions = (
        table.Panel()
        .title("Regions: active controller and datasets owned")
        .description("1 = the region's controller holds its liveness lease")
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .with_target(query("max by (region) (meridian_controller_active)", "{{region}}", "A"))
        .with_target(
            query("sum by (region) (meridian_controller_datasets_owned)", "{{region}}", "B")
        )
    )
    failovers = (
        stat.Panel()
        .title("Automatic failovers (last hour)")
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .with_target(
            query(
                "sum by (region) (increase(meridian_controller_failovers_total[1h]))",
                "won by {{region}}",
            )
        )
    )
    lag = series(
        "Replication lag per dataset against its rpo",
        "s",
        query("meridian:replication_lag_seconds:max", "{{dataset}} in {{region}}", "A"),
        query("meridian:dataset_rpo_seconds", "rpo of {{dataset}}", "B"),
    )
    pending = series(
        "Versions pending per dataset and region",
        "short",
        query(
            "sum by (dataset, region) (meridian_replication_pending)", "{{dataset}} in {{region}}"
        ),
    )
    transfer = series(
        "Transfer bytes received: logical against wire",
        "Bps",
        query(
            'sum by (region, kind) (rate(meridian_transfer_bytes_total{direction="in"}[1m]))',
            "{{region}} {{kind}}",
        ),
    )
    refusals = series(
        "Refusals: residency and stale epochs",
        "short",
        query(
            "sum by (region, dataset) (increase(meridian_residency_refused_total[5m]))",
            "residency: {{dataset}} in {{region}}",
            "A",
        ),
        query(
            "sum by (region) (increase(meridian_stale_epoch_refused_total[5m])) or "
            "sum by (region) (increase(meridian_controller_fenced_writes_total[5m]))",
            "stale epoch in {{region}}",
            "B",
        ),
    )
    pushes = series(
        "Critical pushes to each replica region: wait for a call and the call, p50 and p95",
        "s",
        query(
            "histogram_quantile(0.5, sum by (region, to_region, stage, le) "
            "(rate(meridian_critical_push_seconds_bucket[5m])))",
            "p50 {{stage}}, {{region}} to {{to_region}}",
            "A",
        ),
        query(
            "histogram_quantile(0.95, sum by (region, to_region, stage, le) "
            "(rate(meridian_critical_push_seconds_bucket[5m])))",
            "p95 {{stage}}, {{region}} to {{to_region}}",
            "B",
        ),
    )
    records = series(
        "Records behind the catalog",
        "s",
        query("max by (region) (meridian_records_behind_seconds)", "{{region}}"),
    )
    calls = series(
        "Agent API calls: p95 latency by region and call",
        "s",
        query(
            "histogram_quantile(0.95, sum by (region, call, le) "
            "(rate(meridian_agent_request_seconds_bucket[5m])))",
            "{{call}} in {{region}}",
        ),
    )
    return (
        dashboard.Dashboard("Meridian")
        .uid("meridian-overview")
        .description(
            "Regions and owners, replication lag against rpo, transfers, refusals, call latency"
        )
        .tags(["meridian"])
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("utc")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_row(dashboard.Row("Regions and ownership").id(1))
        .with_panel(regions.id(2))
        .with_panel(failovers.id(3))
        .with_row(dashboard.Row("Replication").id(4))
        .with_panel(lag.id(5))
        .with_panel(pending.id(6))
        .with_panel(pushes.id(12))
        .with_row(dashboard.Row("Transfers and refusals").id(7))
        .with_panel(transfer.id(8))
        .with_panel(refusals.id(9))
        .with_panel(records.id(10))
        .with_panel(calls.id(11))
        .build()
    )


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build()) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            sys.stderr.write(f"{OUT} is not what build.py makes; run python {__file__}\n")
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
