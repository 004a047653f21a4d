"""`meridian replication status`: per dataset and region, how far copies have got, and why
an object is not yet everywhere it should be. Read from the catalog alone.

Per (dataset, region) of every dataset's placement, standard and critical (a
critical replica that missed versions, being down or partitioned when the owner
pushed them, shows them `pending` until the owner's catch-up has pushed them and
its records reached the catalog): `completed` (objects
whose newest version is completed there), `pending` (newest version not completed
there and not failed: not yet attempted, or attempted and to be retried), `failed`
(marked failed after `max_attempts`; `replication resync` re-drives them) and
`lag_s` (the age of the oldest version not completed there, as the replicator's
`meridian_replication_lag_seconds` and `dataset list` compute it). A region's own
writes count as completed there, but for one whose copy there is `failed` (startup
repair found its bytes lost: resync fetches them from a region holding them; the lag
counts them too). With `state`, each row also lists the objects in
that state, each with its attempts, last error and a sentence saying why.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from controlplane.catalog.records import Placement, ReplicaStatus, VersionRef


class StatusCatalog(Protocol):
    def list_placements(self) -> list[Placement]: ...

    def incomplete_versions(self, dataset: str, region: str) -> list[VersionRef]: ...

    def oldest_incomplete_at(self, dataset: str, regions: Sequence[str]) -> datetime | None: ...

    def replica_status(
        self,
        dataset: str,
        *,
        key: str | None = None,
        region: str | None = None,
        states: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[ReplicaStatus]: ...


def _rfc3339(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat().replace("+00:00", "Z")


def _why(state: str, rs: ReplicaStatus | None, critical: bool = False) -> str:
    if rs is None and critical:
        return (
            "lacks it: the owner's synchronous push did not reach it (down, partitioned "
            "or refusing); the owner's catch-up pushes it, and it counts toward acks again "
            "once it lacks nothing"
        )
    if rs is None:
        return "not yet attempted: the replicator has not reached its change event"
    if state == "failed" and rs.attempts == 0:
        return f"{rs.last_error or 'failed here'}; run `meridian replication resync`"
    if state == "failed":
        return (
            f"gave up after {rs.attempts} attempt(s): {rs.last_error or 'no error recorded'}; "
            "run `meridian replication resync` to retry"
        )
    if rs.last_error:
        return f"attempt {rs.attempts} failed ({rs.last_error}); it is being retried"
    return "copy under way"


def replication_status(
    catalog: StatusCatalog,
    now: datetime,
    *,
    dataset_glob: str = "*",
    region: str | None = None,
    state: str | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in sorted(catalog.list_placements(), key=lambda p: p.dataset):
        if not fnmatch.fnmatchcase(p.dataset, dataset_glob):
            continue
        for r in p.regions:
            if region is not None and r != region:
                continue
            rows.append(_row(catalog, p.dataset, r, now, state, p.dataset_class == "critical"))
    return rows


def _row(
    catalog: StatusCatalog,
    dataset: str,
    region: str,
    now: datetime,
    state: str | None,
    critical: bool = False,
) -> dict[str, Any]:
    replicas = catalog.replica_status(dataset, region=region)
    completed_objects = {rs.object for rs in replicas if rs.state == "completed"}
    by_version = {(rs.object, rs.version): rs for rs in replicas}
    # A version made here is counted once its copy here is `failed` (startup repair
    # found its bytes lost: resync fetches them back); before, it is on its way.
    incomplete = {
        (v.object, v.version): v
        for v in catalog.incomplete_versions(dataset, region)
        if not v.hlc.endswith(f"@{region}")
        or ((rs := by_version.get((v.object, v.version))) is not None and rs.state == "failed")
    }
    failed = [n for n in incomplete if (rs := by_version.get(n)) and rs.state == "failed"]
    oldest = catalog.oldest_incomplete_at(dataset, [region])
    row: dict[str, Any] = {
        "dataset": dataset,
        "region": region,
        "completed": len(completed_objects - {o for o, _ in incomplete}),
        "pending": len(incomplete) - len(failed),
        "failed": len(failed),
        "lag_s": 0.0 if oldest is None else round(max(0.0, (now - oldest).total_seconds()), 3),
    }
    if state is not None:
        objects = []
        for name, v in sorted(incomplete.items()):
            rs = by_version.get(name)
            current = "failed" if rs is not None and rs.state == "failed" else "pending"
            if current != state:
                continue
            objects.append(
                {
                    "object": v.object,
                    "version": v.version,
                    "op": v.op,
                    "state": current,
                    "attempts": rs.attempts if rs else 0,
                    "last_error": rs.last_error if rs else None,
                    "attempted_at": _rfc3339(rs.attempted_at if rs else None),
                    "why": _why(current, rs, critical),
                }
            )
        row["objects"] = objects
    return row
