"""The agent's metrics carry the spec's names (dataplane.md, *Metrics*)."""

from __future__ import annotations

from prometheus_client import generate_latest

from agents.metrics import AgentMetrics

SPEC_NAMES = (
    "meridian_agent_objects",
    "meridian_agent_bytes_stored",
    "meridian_transfer_bytes_total",
    "meridian_transfer_seconds",
    "meridian_residency_refused_total",
    "meridian_stale_epoch_refused_total",
    "meridian_records_behind_seconds",
)


def test_every_metric_of_the_spec_is_exposed_and_two_agents_do_not_share_a_registry() -> None:
    one, two = AgentMetrics("eu-west", "a1"), AgentMetrics("us-east", "b1")
    one.transfer_bytes.labels(kind="wire", direction="out").inc(100)
    one.transfer_seconds.labels(direction="out", outcome="ok").observe(0.2)
    one.residency_refused.labels(dataset="ckpt", direction="in").inc()
    one.stale_epoch_refused.labels(dataset="ckpt").inc()
    text = generate_latest(one.registry).decode()
    for name in SPEC_NAMES:
        assert f"\n{name}" in text or text.startswith(name), name
    assert 'meridian_transfer_bytes_total{direction="out",kind="wire"} 100.0' in text
    assert "meridian_transfer_bytes_total{" not in generate_latest(two.registry).decode()
