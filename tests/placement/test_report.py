"""`region show`'s document from registrations (agents/placement/report.py), checked
against the CLI output schema."""

from __future__ import annotations

import json

import pytest
from fakes.coordination import MemoryCoordination
from harness.cli_schema import check_output

from agents.placement.departures import RosterEntry, roster_key
from agents.placement.report import region_report
from controlplane.coordination.protocols import keys
from controlplane.errors import NotFoundError


async def test_report_sums_the_rebalance_and_matches_the_schema() -> None:
    coord = MemoryCoordination()
    for i, (state, moving) in enumerate(
        [("serving", None), ("serving", (10, 2)), ("leaving", (5, 1))]
    ):
        doc: dict[str, object] = {
            "id": f"a{i}",
            "endpoint": f"h:{i}",
            "weight": 1 + i,
            "objects": 3,
            "bytes": 30,
            "state": state,
            "rebalance": None
            if moving is None
            else {"remaining_bytes": moving[0], "remaining_objects": moving[1]},
        }
        await coord.put(keys.agent("eu-west", f"a{i}"), json.dumps(doc).encode())
    report = await region_report(coord, "eu-west")
    check_output("region_show", report)
    assert report["rebalance"] == {"remaining_bytes": 15, "remaining_objects": 3}
    assert report["copies"] == 2
    agents = report["agents"]
    assert isinstance(agents, list) and [a["weight"] for a in agents] == [1, 2, 3]


async def test_unknown_region_is_one_clear_error() -> None:
    with pytest.raises(NotFoundError, match="nowhere"):
        await region_report(MemoryCoordination(), "nowhere")


async def test_a_departed_agent_is_listed_as_not_alive() -> None:
    """With departure records, an agent whose registration is gone but whose roster
    entry stands (SIGKILLed, its host lost) is shown `alive: false`."""
    coord = MemoryCoordination()
    live = {"id": "a0", "endpoint": "h:0", "weight": 1, "objects": 3, "bytes": 30}
    await coord.put(keys.agent("eu-west", "a0"), json.dumps(live).encode())
    for agent_id in ("a0", "a1"):
        entry = RosterEntry(agent_id, 2, f"h:{agent_id[1]}", "2026-12-07T00:00:00Z")
        await coord.put(roster_key("eu-west", agent_id), entry.value())
    report = await region_report(coord, "eu-west")
    check_output("region_show", report)
    agents = report["agents"]
    assert isinstance(agents, list)
    assert [(a["id"], a["alive"], a["endpoint"]) for a in agents] == [
        ("a0", True, "h:0"),
        ("a1", False, "h:1"),
    ]
    await coord.delete(keys.agent("eu-west", "a0"))  # every agent departed: still shown
    gone = await region_report(coord, "eu-west")
    assert [a["alive"] for a in gone["agents"]] == [False, False]  # type: ignore[union-attr]
