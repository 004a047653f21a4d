"""A catch-up toward a region the applied policy no longer places ends on a quiet
dataset, in real agent processes: the daemon gives the replication its admission's
view of the policy (`placement_now`), which the unit tests of the rule fake.

eu-north's agent is cut off while acked writes (`ack: quorum`) go to eu-west and
eu-central, so eu-west catches eu-north up, retrying. Then a policy that drops
eu-north from the dataset's replicas is applied, and nothing more is written: the
catch-up ends (`catch_up_unplaced`) instead of retrying for as long as the agent
runs. Without the wiring it retries for ever (the newest write still names eu-north).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from critical_helpers import critical_policy_doc, topology_doc
from faults_world import LEASE_TTL_S, FaultsWorld, raw_put, wait_owner
from harness.agent_fixtures import clear_keyspace
from harness.controllers import apply_world
from waiting import until

from controlplane.adapters.etcd import EtcdCoordination

pytestmark = pytest.mark.integration

DATASET = "auto/quiet"


def narrowed_policy() -> str:
    """The world's `auto` policy with eu-central its only replica (eu-north dropped)."""
    text = topology_doc("faults")
    text += critical_policy_doc(
        "auto", "auto/*", ["eu-central"], "quorum", failover="automatic", order=["eu-central"]
    )
    text += f"---\napiVersion: meridian/v1\nkind: Dataset\nmetadata:\n  name: {DATASET}\n"
    return text


@pytest.fixture(scope="module")
async def world(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, toxiproxy_url: str
) -> AsyncIterator[FaultsWorld]:
    clear_keyspace(etcd_endpoint)
    w = FaultsWorld(tmp_path_factory.mktemp("unplaced") / "world", etcd_endpoint, toxiproxy_url)
    try:
        await w.start([DATASET])
        yield w
    finally:
        await w.stop()


def owner_events(world: FaultsWorld, name: str) -> list[dict[str, object]]:
    return [
        e
        for e in world.agents["eu-west"].events()
        if e.get("event") == name and e.get("dataset") == DATASET and e.get("region") == "eu-north"
    ]


async def test_a_catch_up_ends_once_the_policy_drops_the_region(
    world: FaultsWorld, etcd_endpoint: str
) -> None:
    async with EtcdCoordination([etcd_endpoint], timeout_s=5) as coord:
        await wait_owner(coord, DATASET, lambda o: o.region == "eu-west", 30 + LEASE_TTL_S)
    west = world.agents["eu-west"].address
    await world.partition("eu-north", cut=True)
    try:
        for i in range(3):
            done = await raw_put(west, DATASET, f"k{i}", f"v{i}".encode())
            assert "eu-north" not in done.regions  # acked by eu-west and eu-central

        async def retrying() -> bool:
            return len(owner_events(world, "catch_up_retry")) >= 1

        await until(retrying, 30, what="eu-west retrying its catch-up of eu-north")
        await asyncio.to_thread(
            apply_world, world.folder / "narrowed", world.env, narrowed_policy()
        )

        async def unplaced() -> bool:
            return bool(owner_events(world, "catch_up_unplaced"))

        # Within a retry (at most 5 s apart) of the agents' view taking the policy.
        await until(
            unplaced,
            30,
            what="the catch-up of eu-north to end as the policy dropped it",
            detail=lambda: owner_events(world, "catch_up_retry")[-1:],
        )
    finally:
        await world.partition("eu-north", cut=False)
