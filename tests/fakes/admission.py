"""In-memory sources for `agents.admission.Admission` in unit tests: a fixed applied
policy (`StaticPolicy`) and owner records a test sets (`MemoryOwners`)."""

from __future__ import annotations

from collections.abc import Mapping

from agents.admission import OwnerRecord
from controlplane.coordination.timeutil import utcnow
from controlplane.domain.placement import Placement
from controlplane.errors import UnavailableError
from controlplane.policy.current import CompiledPolicy, NoPolicyError


def compiled(
    regions: Mapping[str, str], placements: list[Placement], revision: int = 1
) -> CompiledPolicy:
    """A compiled policy of exactly these regions (name -> jurisdiction) and placements;
    no rules, so no other dataset is governed."""
    rules = {
        "topology": "test",
        "regions": {n: {"jurisdiction": j} for n, j in regions.items()},
        "links": {},
        "policies": {},
        "datasets": {},
    }
    return CompiledPolicy(
        digest=f"test-{revision}",
        revision=revision,
        applied_at=utcnow(),
        regions=dict(regions),
        links={},
        placements={p.dataset: p for p in placements},
        rules=rules,
    )


class StaticPolicy:
    """A `PolicySource` holding one snapshot (or none: `current = None`)."""

    def __init__(self, current: CompiledPolicy | None) -> None:
        self.current = current

    def require(self) -> CompiledPolicy:
        if self.current is None:
            raise NoPolicyError("no policy has been applied (run `meridian policy apply`)")
        return self.current


class MemoryOwners:
    """An `OwnerSource` whose records a test sets; `unavailable` makes `owner` fail as
    an unreachable etcd would."""

    def __init__(self) -> None:
        self.records: dict[str, OwnerRecord] = {}
        self.unavailable = False
        self.reads = 0

    def set(
        self,
        dataset: str,
        region: str,
        epoch: int,
        *,
        handing_over: bool = False,
        to: str | None = None,
    ) -> None:
        self.records[dataset] = OwnerRecord(dataset, region, epoch, handing_over, to)

    async def owner(self, dataset: str) -> OwnerRecord | None:
        self.reads += 1
        if self.unavailable:
            raise UnavailableError(f"the owner of {dataset} cannot be read from etcd (test)")
        return self.records.get(dataset)

    def known(self, dataset: str) -> OwnerRecord | None:
        return self.records.get(dataset)
