"""The PromQL queries of the Grafana dashboard (deploy/grafana/meridian.json), so a live
test can run every panel's query against a Prometheus and expect data from each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import InvalidInputError
from controlplane.observability import DASHBOARD_PATH


@dataclass(frozen=True)
class PanelQuery:
    panel: str  # the panel's title
    ref_id: str  # the target's refId within its panel (A, B, ...)
    expr: str  # PromQL, with no dashboard variables (it runs as it is)


def panel_queries(path: Path = DASHBOARD_PATH) -> list[PanelQuery]:
    """Every Prometheus target of every panel (rows' nested panels too), in order.

    Raises InvalidInputError naming the file and panel when a panel has no query or a
    query is empty, so a live test cannot pass by checking nothing."""
    try:
        document: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{path}: cannot read the dashboard ({exc})") from exc
    queries: list[PanelQuery] = []
    for panel in _panels(document.get("panels", [])):
        if panel.get("type") in ("row", "text"):
            continue
        title = str(panel.get("title", ""))
        targets = panel.get("targets") or []
        if not targets:
            raise InvalidInputError(f"{path}: panel {title!r} has no query")
        for target in targets:
            expr = str(target.get("expr", "")).strip()
            if not expr:
                raise InvalidInputError(
                    f"{path}: panel {title!r} target {target.get('refId')} has no expr"
                )
            queries.append(PanelQuery(panel=title, ref_id=str(target.get("refId", "")), expr=expr))
    return queries


def _panels(panels: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for panel in panels:
        flat.append(panel)
        flat.extend(_panels(panel.get("panels") or []))  # a collapsed row keeps its panels
    return flat
