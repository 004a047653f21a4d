"""Critical datasets first seen after an apply: announced in etcd, then claimed and
failed over like the published ones."""

from __future__ import annotations

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from fakes.coordination import MemoryCoordination

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.datasets import announce, announced, placements_of
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.policy.current import CompiledPolicy
from controlplane.policy.publisher import CoordinationPolicyPublisher
from controlplane.stack.etcd import EtcdCluster

from .helpers import wait_until
from .test_policy_view import compiled

World = tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]


async def test_the_first_announcement_stays_and_a_second_changes_nothing() -> None:
    async with MemoryCoordination() as coord:
        assert await announce(coord, "ckpt/gpt-9", by="eu-west/a1", labels={"team": "pretrain"})
        assert not await announce(coord, "ckpt/gpt-9", by="us-east/b1", labels={"team": "x"})
        assert await announced(coord) == {"ckpt/gpt-9": {"team": "pretrain"}}
        raw = await coord.get(keys.dataset("ckpt/gpt-9"))
        assert raw is not None and b"eu-west/a1" in raw.value


def test_announced_datasets_are_placed_by_the_rules_and_ungoverned_ones_left_out() -> None:
    policy = CompiledPolicy.from_json(compiled().to_json())
    found = placements_of(
        policy, {"ckpt/gpt-9": {"team": "pretrain"}, "logs/x": {}, "ckpt/llama-70b": {}}
    )
    names = [p.dataset for p in found]
    assert names == sorted({*policy.placements, "ckpt/gpt-9"})
    gpt = next(p for p in found if p.dataset == "ckpt/gpt-9")
    assert (gpt.dataset_class, gpt.home) == ("critical", "eu-west")
    # A published placement is never replaced by what the rules would say now.
    assert (
        next(p for p in found if p.dataset == "ckpt/llama-70b")
        == (policy.placements["ckpt/llama-70b"])
    )


@pytest.mark.integration
async def test_the_home_region_claims_a_critical_dataset_announced_after_the_apply(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    _, journal, probe = world
    await CoordinationPolicyPublisher(coord).publish(compiled())
    config = ControllerConfig("eu-west", "w", lease_ttl_s=3, reconcile_interval_s=0.2)
    own = Ownership(coord)

    async def owner_of(name: str) -> bool:
        return (await own.list()).get(name) is not None

    async with (
        EtcdCoordination(etcd3.endpoints, timeout_s=3) as c,
        RegionController(c, journal, probe, config) as west,
    ):
        assert await wait_until(lambda: owner_of("ckpt/llama-70b"), 10)
        assert not await owner_of("ckpt/gpt-9")
        await announce(coord, "ckpt/gpt-9", by="eu-west/a1", labels={"team": "pretrain"})
        assert await wait_until(lambda: owner_of("ckpt/gpt-9"), 10)
        owners = await own.list()
        assert owners["ckpt/gpt-9"].region == "eu-west"
        epoch = owners["ckpt/gpt-9"].epoch

        async def tracked() -> bool:
            # The controller tracks a claim once its reply is back, which may be after
            # etcd shows it to another connection.
            return west.owned.get("ckpt/gpt-9", 0) == epoch

        assert await wait_until(tracked, 5)
