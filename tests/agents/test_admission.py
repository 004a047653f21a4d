"""Admission's decisions on their own: residency both ways, and the fence of pushed copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_api_helpers import CRITICAL, REGION, REGIONS, STANDARD, US_ONLY, world
from fakes.admission import MemoryOwners, StaticPolicy, compiled
from structlog.testing import capture_logs

from agents.admission import Admission
from agents.errors import NotGovernedError, ResidencyError
from agents.metrics import AgentMetrics
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.timeutil import utcnow
from controlplane.errors import FencedError, InvalidInputError, UnavailableError
from controlplane.policy.compiler import compile_files
from controlplane.policy.current import CompiledPolicy


def make(region: str = REGION) -> tuple[Admission, FencedResource, MemoryOwners, AgentMetrics]:
    fence = FencedResource()
    owners = MemoryOwners()
    owners.set(CRITICAL, REGION, 7)
    metrics = AgentMetrics(region)
    policy = StaticPolicy(compiled(REGIONS, world()))
    return Admission(region, policy, fence, owners, metrics), fence, owners, metrics


def refused(metrics: AgentMetrics, dataset: str, direction: str) -> float:
    value = metrics.registry.get_sample_value(
        "meridian_residency_refused_total", {"dataset": dataset, "direction": direction}
    )
    return value or 0.0


def test_the_sender_refuses_to_send_outside_the_residency_and_counts_it() -> None:
    admission, _, _, metrics = make()
    assert admission.admit_send(CRITICAL, "eu-central").dataset == CRITICAL
    with pytest.raises(ResidencyError, match="us-east is in US"):
        admission.admit_send(CRITICAL, "us-east")
    assert refused(metrics, CRITICAL, "send") == 1
    assert refused(metrics, CRITICAL, "receive") == 0


def test_the_receiver_refuses_to_store_outside_the_residency() -> None:
    admission, _, _, metrics = make()
    with pytest.raises(ResidencyError):
        admission.admit_store(US_ONLY)
    assert refused(metrics, US_ONLY, "receive") == 1
    us, _, _, _ = make("us-east")
    assert us.admit_store(US_ONLY).home == "us-east"


def test_a_region_the_topology_lacks_is_not_governed() -> None:
    admission, _, _, _ = make()
    with pytest.raises(NotGovernedError, match="ap-south"):
        admission.admit_send(STANDARD, "ap-south")


def test_a_pushed_critical_copy_goes_through_the_fence() -> None:
    admission, fence, owners, metrics = make("eu-central")
    assert admission.admit_replica(CRITICAL, 7, REGION).dataset_class == "critical"
    assert fence.highest_epoch(CRITICAL) == 7
    assert admission.admit_replica(CRITICAL, 9, REGION)  # a newer owner's epoch
    with pytest.raises(StaleEpochError):
        admission.admit_replica(CRITICAL, 7, REGION)
    stale = metrics.registry.get_sample_value(
        "meridian_stale_epoch_refused_total", {"dataset": CRITICAL}
    )
    assert stale == 1
    fence.observe(CRITICAL, 9, handing_over=True)
    with pytest.raises(DatasetHandingOverError):
        admission.admit_replica(CRITICAL, 9, REGION)
    del owners


def test_a_pushed_copy_from_a_region_that_did_not_own_that_epoch_is_refused() -> None:
    admission, _, _, _ = make("eu-central")
    with pytest.raises(FencedError, match="owner at that epoch is eu-west"):
        admission.admit_replica(CRITICAL, 7, "eu-north")


def test_a_pushed_critical_copy_needs_an_epoch_and_a_standard_one_none() -> None:
    admission, _, _, _ = make("eu-central")
    with pytest.raises(InvalidInputError, match="epoch"):
        admission.admit_replica(CRITICAL, 0, REGION)
    assert admission.admit_replica(STANDARD, 0, REGION).dataset_class == "standard"


async def test_a_standard_write_ignores_ownership_and_carries_no_epoch() -> None:
    admission, _, owners, _ = make()
    owners.unavailable = True  # etcd down does not stop standard writes
    admitted = await admission.admit_write(STANDARD, None)
    assert (admitted.epoch, admitted.critical, admitted.policy_revision) == (0, False, 1)
    assert owners.reads == 0


async def test_a_critical_write_without_an_epoch_gets_the_owners() -> None:
    admission, fence, _, _ = make()
    admitted = await admission.admit_write(CRITICAL, None)
    assert (admitted.epoch, admitted.critical) == (7, True)
    assert fence.highest_epoch(CRITICAL) == 7


async def test_an_epoch_newer_than_the_cached_owner_is_checked_in_etcd_now() -> None:
    """A claim committed since the agent's last bounded-age read: the client's newer
    epoch, or one the fence has seen, is decided by etcd read now (the cache alone
    refused it, the second as this region's own stale epoch); a made-up epoch is still
    refused."""
    fence = FencedResource()
    cached, etcd = MemoryOwners(), MemoryOwners()
    cached.set(CRITICAL, REGION, 7)
    etcd.set(CRITICAL, REGION, 9)
    policy = StaticPolicy(compiled(REGIONS, world()))
    admission = Admission(
        REGION, policy, fence, cached, AgentMetrics(REGION), fresh_owner=etcd.owner
    )
    admitted = await admission.admit_write(CRITICAL, 9)
    assert admitted.epoch == 9 and etcd.reads == 1
    assert fence.highest_epoch(CRITICAL) == 9
    with pytest.raises(FencedError, match="epoch 12"):
        await admission.admit_write(CRITICAL, 12)
    # No epoch stated, and the fence has seen 9: etcd again, not the cache's 7.
    assert (await admission.admit_write(CRITICAL, None)).epoch == 9
    assert etcd.reads == 3
    cached.set(CRITICAL, REGION, 9)  # the cache caught up: no read of etcd
    assert (await admission.admit_write(CRITICAL, None)).epoch == 9
    assert etcd.reads == 3


def rules_policy() -> CompiledPolicy:
    """The example policy of tests/policy/data, compiled with its rules (a dataset the
    publish did not list is placed by them)."""
    policy, problems = compile_files(
        [Path(__file__).parents[1] / "policy" / "data" / "example.yaml"]
    )
    assert policy is not None, problems
    return CompiledPolicy.build(
        policy, policy.placements({}), digest="rules-1", revision=3, applied_at=utcnow()
    )


async def test_a_dataset_placed_by_the_rules_is_announced_once_and_admitted() -> None:
    announced: list[str] = []

    async def announce(dataset: str) -> None:
        announced.append(dataset)

    policy = rules_policy()
    assert "corpus/new-shard" not in policy.placements
    admission = Admission(
        "eu-west",
        StaticPolicy(policy),
        FencedResource(),
        MemoryOwners(),
        AgentMetrics("eu-west"),
        announce=announce,
    )
    for _ in range(3):
        admitted = await admission.admit_write("corpus/new-shard", None)
    assert admitted.placement.dataset_class == "standard"
    assert admitted.policy_revision == 3
    assert announced == ["corpus/new-shard"]
    # An ungoverned dataset is refused, and not announced.
    with pytest.raises(NotGovernedError):
        await admission.admit_write("logs/nobody", None)
    assert announced == ["corpus/new-shard"]


async def test_a_failed_announcement_does_not_stop_a_standard_write_and_is_retried() -> None:
    calls = 0

    async def announce(dataset: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise UnavailableError("etcd is down (test)")

    admission = Admission(
        "eu-west",
        StaticPolicy(rules_policy()),
        FencedResource(),
        MemoryOwners(),
        AgentMetrics("eu-west"),
        announce=announce,
    )
    await admission.admit_write("corpus/new-shard", None)
    await admission.admit_write("corpus/new-shard", None)
    await admission.admit_write("corpus/new-shard", None)
    assert calls == 2


def test_a_stale_epoch_refusal_is_logged_with_the_refusing_region() -> None:
    # The chaos suite's split-brain checker reads refusals from the agent's log
    # (chaos/records.py): each must say which region refused, at which epoch.
    admission, _fence, _owners, _metrics = make("eu-central")
    admission.admit_replica(CRITICAL, 9, REGION)
    with capture_logs() as logs, pytest.raises(StaleEpochError):
        admission.admit_replica(CRITICAL, 7, REGION)
    refusals = [e for e in logs if e["event"] == "stale_epoch_refused"]
    assert [(e["region"], e["dataset"], e["epoch"]) for e in refusals] == [
        ("eu-central", CRITICAL, 7)
    ]
