"""`eviction_refused`: the one rule by which the CLI and each agent refuse to evict a
region's copies (controlplane/domain/eviction.py)."""

from __future__ import annotations

import dataclasses

import pytest
from placements import critical

from controlplane.domain.eviction import OwnerSeen, eviction_refused, placement_digest
from controlplane.domain.placement import Placement

PLACED = critical(
    "ckpt/a",
    replicas=("eu-central",),
    policy="checkpoints",
    failover_mode="automatic",
    failover_order=("eu-central", "eu-south"),
)


@pytest.mark.parametrize("region", ["eu-west", "eu-central", "eu-south"])
def test_a_region_the_policy_places_it_in_is_refused(region: str) -> None:
    why = eviction_refused(PLACED, region, None, seen_by="this agent")
    assert why is not None and f"still places it in {region}" in why
    assert "as this agent sees it" in why


@pytest.mark.parametrize(
    "owner",
    [OwnerSeen("eu-north", 4), OwnerSeen("eu-west", 5, handover_to="eu-north")],
)
def test_the_owner_or_a_handovers_target_is_refused(owner: OwnerSeen) -> None:
    why = eviction_refused(PLACED, "eu-north", owner)
    assert why is not None and "names eu-north its owner" in why


def test_a_region_neither_placed_nor_owning_may_evict() -> None:
    assert eviction_refused(PLACED, "eu-north", OwnerSeen("eu-west", 4)) is None
    assert eviction_refused(PLACED, "eu-north", None) is None


def test_the_placement_digest_names_the_placement_and_nothing_else() -> None:
    """What a proof was made under: equal placements give equal digests, however they
    were built; any change (here a failover candidate) gives another."""
    again = Placement.from_json(PLACED.as_json())
    assert placement_digest(again) == placement_digest(PLACED)
    moved = dataclasses.replace(PLACED, failover_order=("eu-central",))
    assert placement_digest(moved) != placement_digest(PLACED)
