"""The demo's Prometheus configuration: labels the rules rely on, and promtool accepts it."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_helpers import explain, run_tool
from ruamel.yaml import YAML

from controlplane.errors import MeridianError
from controlplane.observability import RULES_DIR
from controlplane.observability.scrape import write_scrape_config

ENDPOINTS = {
    "controller": ["127.0.0.1:9300", "127.0.0.1:9301"],
    "agent": ["127.0.0.1:9500", "127.0.0.1:9501"],
}
REGIONS = {
    "127.0.0.1:9300": "eu-west",
    "127.0.0.1:9301": "us-east",
    "127.0.0.1:9500": "eu-west",
    "127.0.0.1:9501": "us-east",
}


def test_config_labels_each_target_and_loads_the_rules(promtool: Path, tmp_path: Path) -> None:
    path = write_scrape_config(tmp_path / "prometheus.yml", ENDPOINTS, regions=REGIONS)
    config = YAML(typ="safe", pure=True).load(path.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"controller", "agent"}
    groups = {g["labels"]["region"]: g for g in jobs["agent"]["static_configs"]}
    assert groups["us-east"] == {
        "targets": ["127.0.0.1:9501"],
        "labels": {"region": "us-east", "component": "agent"},
    }
    assert config["rule_files"] == [str(p.resolve()) for p in sorted(RULES_DIR.glob("*.yml"))]
    done = run_tool([promtool, "check", "config", path])
    assert done.returncode == 0, explain(done)
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("endpoints", "regions", "message"),
    [
        ({"agent": ["127.0.0.1:9500"]}, {}, "127.0.0.1:9500 of job agent has no region"),
        ({"agent": ["localhost"]}, {"localhost": "eu-west"}, "localhost"),
        ({"agent": ["a:1,b:2"]}, {"a:1,b:2": "eu-west"}, "not one host:port"),
        ({"agent": []}, {}, "at least one address"),
    ],
)
def test_bad_endpoints_refused_and_nothing_written(
    tmp_path: Path, endpoints: dict[str, list[str]], regions: dict[str, str], message: str
) -> None:
    path = tmp_path / "prometheus.yml"
    with pytest.raises(MeridianError, match=message):
        write_scrape_config(path, endpoints, regions=regions)
    assert not path.exists()
