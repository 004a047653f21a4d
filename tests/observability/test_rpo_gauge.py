"""The replicator exports each standard dataset's rpo beside its lag, which the
dashboard's lag panel and the lag-over-rpo alert divide by (deploy/prometheus/)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.domain.placement import Placement
from replicator.backlog import BacklogProbe
from replicator.metrics import ReplicatorMetrics


def _placement(dataset: str, rpo_s: float, regions: tuple[str, ...]) -> Placement:
    return Placement(
        dataset=dataset,
        policy="p",
        dataset_class="standard",
        home=regions[0],
        replicas=regions[1:],
        residency=("EU",),
        rpo_s=rpo_s,
        failover_mode="manual",
        failover_order=(),
    )


class Source:
    def __init__(self) -> None:
        self.placements = [
            _placement("corpus/web", 30, ("eu-west", "eu-central")),
            _placement("corpus/far", 60, ("eu-west", "eu-north")),
        ]

    def list_placements(self) -> list[Placement]:
        return self.placements

    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None:
        return None

    def incomplete_versions(self, dataset: str, region: str) -> list[object]:
        return []


async def test_the_rpo_gauge_follows_the_placements_of_the_region() -> None:
    source, metrics = Source(), ReplicatorMetrics("eu-central")
    probe = BacklogProbe(source, "eu-central", metrics)  # type: ignore[arg-type]
    await probe.refresh()
    rpo = {"dataset": "corpus/web", "region": "eu-central"}
    assert metrics.registry.get_sample_value("meridian_dataset_rpo_seconds", rpo) == 30
    # corpus/far is not placed in eu-central: no rpo exported for it there.
    far = {"dataset": "corpus/far", "region": "eu-central"}
    assert metrics.registry.get_sample_value("meridian_dataset_rpo_seconds", far) is None
    source.placements = source.placements[1:]  # corpus/web no longer placed here
    await probe.refresh()
    assert metrics.registry.get_sample_value("meridian_dataset_rpo_seconds", rpo) is None
