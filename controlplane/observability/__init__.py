"""What the repository's Prometheus rules and Grafana dashboard (deploy/) need from code:
the scrape configuration for a set of Meridian daemons, and the dashboard's queries."""

from __future__ import annotations

from pathlib import Path

# deploy/ is beside the packages in a checkout (the demo and the tests run from one).
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
RULES_DIR = DEPLOY_DIR / "prometheus" / "rules"
DASHBOARD_PATH = DEPLOY_DIR / "grafana" / "meridian.json"
