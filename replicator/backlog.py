"""The backlog of a region, from durable state: `meridian_replication_lag_seconds` and
`meridian_replication_pending`, with `meridian_dataset_rpo_seconds` (the target the
lag is held to: the Prometheus rules divide one by the other).

Every `interval_s` (and once at start, so a restarted replicator reports the true
backlog at once) the probe asks the catalog, for each standard dataset placed in
this region: the HLC wall time of the oldest version not completed here
(`Catalog.oldest_incomplete_at`; lag = now minus it, 0 when none) and the objects
whose newest version is not completed here (`Catalog.incomplete_versions`). A version
made here counts only once its copy here is `failed` (startup repair found its bytes
lost). These are the same numbers `meridian replication status` and `dataset list`
print.
Nothing is counted in memory, so a restart neither resets nor doubles them. When
the catalog is down the gauges keep their last values and the probe says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from controlplane.catalog.records import Placement, ReplicaStatus, VersionRef
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from replicator.metrics import ReplicatorMetrics

log = get_logger("meridian.replicator.backlog")


class BacklogSource(Protocol):
    """What the probe reads of the catalog (`controlplane.catalog.api.Catalog`)."""

    def list_placements(self) -> list[Placement]: ...

    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None: ...

    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]: ...

    def replica_status(
        self, dataset: str, *, region: str | None = None, states: Sequence[str] | None = None
    ) -> list[ReplicaStatus]: ...


def backlog_of(
    source: BacklogSource, region: str, now: datetime
) -> dict[str, tuple[float, int, float]]:
    """Per standard dataset placed in `region`: (lag in seconds, pending objects, its rpo
    in seconds)."""
    out: dict[str, tuple[float, int, float]] = {}
    for placement in source.list_placements():
        if placement.dataset_class != "standard" or region not in placement.regions:
            continue
        oldest = source.oldest_incomplete_at(placement.dataset, [region])
        lag = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
        incomplete = source.incomplete_versions(placement.dataset, region)
        # A version made here is on its way to the catalog, not a backlog, unless its copy
        # here is `failed`: its bytes were lost here, and only a fetch from another region
        # brings them back. Failed replicas are rare: looked up only when one may matter.
        lost_here: set[tuple[str, str]] = set()
        if any(v.hlc.endswith(f"@{region}") for v in incomplete):
            failed = source.replica_status(placement.dataset, region=region, states=["failed"])
            lost_here = {(rs.object, rs.version) for rs in failed}
        pending = [
            v
            for v in incomplete
            if not v.hlc.endswith(f"@{region}") or (v.object, v.version) in lost_here
        ]
        out[placement.dataset] = (lag, len(pending), placement.rpo_s)
    return out


class BacklogProbe(Lifecycle):
    def __init__(
        self,
        source: BacklogSource,
        region: str,
        metrics: ReplicatorMetrics,
        *,
        interval_s: float = 1.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._source = source
        self._region = region
        self._metrics = metrics
        self._interval_s = interval_s
        self._now = now
        self._known: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.refreshed = asyncio.Event()  # set after each successful refresh

    async def refresh(self) -> dict[str, tuple[float, int, float]]:
        found = await asyncio.to_thread(backlog_of, self._source, self._region, self._now())
        for dataset, (lag, pending, rpo) in found.items():
            self._metrics.lag_seconds.labels(dataset, self._region).set(lag)
            self._metrics.pending.labels(dataset, self._region).set(pending)
            self._metrics.rpo_seconds.labels(dataset, self._region).set(rpo)
        for gone in self._known - set(found):  # no longer placed here: no backlog here
            with contextlib.suppress(KeyError):
                self._metrics.lag_seconds.remove(gone, self._region)
                self._metrics.pending.remove(gone, self._region)
                self._metrics.rpo_seconds.remove(gone, self._region)
        self._known = set(found)
        self.refreshed.set()
        return found

    async def _do_start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replicator-backlog")

    async def _do_stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except MeridianError as exc:
                log.warning(
                    "backlog_unknown",
                    region=self._region,
                    error=str(exc),
                    action="lag and pending keep their last values until the catalog answers",
                )
            await asyncio.sleep(self._interval_s)
