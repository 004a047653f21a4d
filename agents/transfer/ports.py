"""What transfers need from the rest of the agent, as small typed ports: admission
(agents/admission.py, the api engineer's) and the applied policy (for jurisdictions,
link RTTs and bandwidth)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol

from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy


class AdmissionPort(Protocol):
    """The admission decisions a transfer asks for (contracts.md, *Admission*). Each
    raises its refusal (ResidencyError, StaleEpochError, DatasetHandingOverError,
    NotGovernedError) and counts it; a returned Placement is an admission."""

    def placement(self, dataset: str) -> Placement: ...

    def admit_store(self, dataset: str) -> Placement: ...

    def admit_send(self, dataset: str, to_region: str) -> Placement: ...

    def admit_replica(
        self,
        dataset: str,
        epoch: int,
        origin_region: str,
        *,
        rewind: bool = False,
        fresh_read_next: bool = False,
    ) -> Placement: ...

    async def admit_replica_current(
        self, dataset: str, epoch: int, origin_region: str, *, rewind: bool = False
    ) -> Placement: ...

    def receiving(self, datasets: Iterable[str]) -> AbstractContextManager[None]: ...


# The applied policy now (None before the first one arrives): `PolicyView.current`.
PolicySource = Callable[[], CompiledPolicy | None]
