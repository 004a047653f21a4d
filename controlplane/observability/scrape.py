"""A Prometheus configuration that scrapes given Meridian daemons and loads the rules.

The rules in deploy/prometheus/rules/ expect every series to carry the target labels
`region` and `component` (controller, agent or replicator), which this configuration
sets: the component is the job's name, the region is given per address.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ruamel.yaml import YAML

from controlplane.errors import InvalidInputError
from controlplane.observability import RULES_DIR
from controlplane.settings import parse_endpoints

COMPONENTS = ("controller", "agent", "replicator")


def scrape_config(
    endpoints: Mapping[str, Sequence[str]],
    *,
    regions: Mapping[str, str],
    rule_files: Sequence[Path] | None = None,
    scrape_interval_s: float = 5,
) -> dict[str, object]:
    """The configuration as a mapping: one job per key of `endpoints` (`{job: [host:port]}`),
    each target labelled with its region from `regions` (`{host:port: region}`).

    Raises InvalidInputError naming the job and address when an address is malformed or
    has no region, so a half-labelled configuration is never written."""
    if scrape_interval_s <= 0:
        raise InvalidInputError(f"scrape interval must be positive, got {scrape_interval_s}")
    jobs: list[dict[str, object]] = []
    for job, addresses in endpoints.items():
        if not job or not addresses:
            raise InvalidInputError(f"scrape job {job!r} needs a name and at least one address")
        by_region: dict[str, list[str]] = {}
        for address in addresses:
            if len(parse_endpoints(address, setting=f"scrape target of job {job}")) != 1:
                raise InvalidInputError(
                    f"scrape target {address!r} of job {job} is not one host:port"
                )
            region = regions.get(address)
            if not region:
                raise InvalidInputError(f"scrape target {address} of job {job} has no region")
            by_region.setdefault(region, []).append(address)
        jobs.append(
            {
                "job_name": job,
                # A daemon's own `region` label (the lag's, the info gauges') wins: it
                # names the same region, and keeping it spares an `exported_region`.
                "honor_labels": True,
                "static_configs": [
                    {"targets": targets, "labels": {"region": region, "component": job}}
                    for region, targets in sorted(by_region.items())
                ],
            }
        )
    files = sorted(RULES_DIR.glob("*.yml")) if rule_files is None else list(rule_files)
    interval = f"{scrape_interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path.resolve()) for path in files],
        "scrape_configs": jobs,
    }


def write_scrape_config(
    path: Path,
    endpoints: Mapping[str, Sequence[str]],
    *,
    regions: Mapping[str, str],
    rule_files: Sequence[Path] | None = None,
    scrape_interval_s: float = 5,
) -> Path:
    """Write prometheus.yml atomically (a Prometheus reload never reads half a file)."""
    config = scrape_config(
        endpoints, regions=regions, rule_files=rule_files, scrape_interval_s=scrape_interval_s
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as handle:
        YAML(typ="safe", pure=True).dump(config, handle)
    os.replace(tmp, path)
    return path
