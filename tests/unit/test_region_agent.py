"""`replicator run --region R` and `replication resync` without --agent apply through
an agent the region registered in etcd (controlplane/cli/region_agent.py), routed as
MERIDIAN_AGENT_ROUTES says; none registered is one sentence naming --agent."""

from __future__ import annotations

import json

import pytest
from fakes.coordination import MemoryCoordination

from controlplane.cli.region_agent import registered_agent
from controlplane.coordination.protocols import keys
from controlplane.errors import ConfigError
from controlplane.settings import load_settings


async def test_a_registered_agent_of_the_region_is_found_and_routed() -> None:
    coord = MemoryCoordination()
    for region, agent_id, endpoint in (
        ("eu-west", "w1", "10.0.0.1:7400"),
        ("eu-central", "c1", "10.0.0.2:7400"),
    ):
        await coord.put(keys.agent(region, agent_id), json.dumps({"endpoint": endpoint}).encode())
    settings = load_settings(check_endpoints=False)
    assert await registered_agent(settings, "eu-central", coord) == "10.0.0.2:7400"
    routed = load_settings(check_endpoints=False, agent_routes="eu-central=127.0.0.1:9400")
    assert await registered_agent(routed, "eu-central", coord) == "127.0.0.1:9400"
    with pytest.raises(ConfigError, match=r"region us-east has no agent registered.*--agent"):
        await registered_agent(settings, "us-east", coord)
