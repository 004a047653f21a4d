"""Shared topology and placements of the coordination tests."""

from __future__ import annotations

from controlplane.coordination.sources import PlacementInfo, RegionInfo

REGIONS = [
    RegionInfo("eu-west", "EU"),
    RegionInfo("eu-central", "EU"),
    RegionInfo("eu-north", "EU"),
    RegionInfo("us-east", "US"),
]


def critical(
    name: str,
    home: str = "eu-west",
    order: tuple[str, ...] = ("eu-central", "eu-north"),
    mode: str = "automatic",
) -> PlacementInfo:
    return PlacementInfo(
        dataset=name,
        policy="checkpoints",
        dataset_class="critical",
        home=home,
        replicas=order,
        residency=("EU",),
        failover_mode=mode,
        failover_order=order,
    )
