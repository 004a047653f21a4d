"""An in-memory stand-in for `agents.admission.Admission` (contracts.md, *Admission*),
for transfer tests until the api engineer's lands: residency from a region ->
jurisdiction map and the datasets' placements, fencing from an epoch table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.errors import ResidencyError
from agents.metrics import AgentMetrics
from controlplane.coordination.protocols.fencing import DatasetHandingOverError, StaleEpochError
from controlplane.domain.placement import Placement
from controlplane.errors import UnavailableError


@dataclass
class FakeAdmission:
    region: str
    regions: Mapping[str, str]  # region -> jurisdiction
    placements: dict[str, Placement]
    metrics: AgentMetrics
    epochs: dict[str, int] = field(default_factory=dict)  # newest epoch seen per dataset
    handing_over: set[str] = field(default_factory=set)

    def placement(self, dataset: str) -> Placement:
        found = self.placements.get(dataset)
        if found is None:
            raise UnavailableError(f"no applied policy governs dataset {dataset}")
        return found

    def _resident(self, dataset: str, region: str, direction: str) -> Placement:
        placement = self.placement(dataset)
        if self.regions.get(region) not in placement.residency:
            self.metrics.residency_refused.labels(dataset=dataset, direction=direction).inc()
            raise ResidencyError(
                f"dataset {dataset} may not be held in {region} "
                f"({self.regions.get(region)}): its residency is {', '.join(placement.residency)}"
            )
        return placement

    def admit_store(self, dataset: str) -> Placement:
        return self._resident(dataset, self.region, "in")

    def admit_send(self, dataset: str, to_region: str) -> Placement:
        return self._resident(dataset, to_region, "out")

    def admit_write(self, dataset: str, epoch: int | None) -> Placement:
        return self.admit_store(dataset)

    def admit_replica(self, dataset: str, epoch: int, origin_region: str) -> Placement:
        placement = self.admit_store(dataset)
        if dataset in self.handing_over:
            raise DatasetHandingOverError(f"dataset {dataset} is being handed over; retry")
        newest = self.epochs.get(dataset, 0)
        if epoch < newest:
            self.metrics.stale_epoch_refused.labels(dataset=dataset).inc()
            raise StaleEpochError(
                f"dataset {dataset}: epoch {epoch} from {origin_region} is older than {newest}"
            )
        self.epochs[dataset] = epoch
        return placement
