"""`apply`: write a valid policy set to the catalog as one revision, then publish it.

The catalog commits the revision in one transaction (`Catalog.apply_revision`,
which also refuses stranding replicas and keeps two applies from interleaving);
this module only decides what the revision is, from the state the catalog read
under its lock. Applying a set that changes nothing records nothing. The etcd key is written after
the commit and always names the catalog's head, so re-running apply republishes.
"""

from __future__ import annotations

import asyncio
import getpass
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from controlplane.catalog.api import Catalog
from controlplane.catalog.errors import StrandedReplicasError
from controlplane.catalog.records import CatalogState, Placement, RevisionDraft
from controlplane.errors import ConflictError
from controlplane.policy.compiler import PolicySet
from controlplane.policy.current import CompiledPolicy
from controlplane.policy.plan import Change, compute_plan
from controlplane.policy.publisher import PolicyPublisher

__all__ = ["ApplyResult", "StrandedReplicasError", "apply_policy", "plan_changes"]


@dataclass(frozen=True)
class ApplyResult:
    changes: list[Change]
    revision: int
    digest: str
    applied_at: datetime
    published: bool


def describe_source(paths: Sequence[Path]) -> str:
    """The git commit holding the files (with `+dirty` if they differ), else their paths."""
    names = ",".join(str(p) for p in paths)
    if not paths:
        return names
    folder = paths[0].resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # Resolved: a relative path is taken from `folder`, not from where we run.
            [
                "git",
                "-C",
                str(folder),
                "status",
                "--porcelain",
                "--",
                *(str(p.resolve()) for p in paths),
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return names
    return f"git:{sha}{'+dirty' if dirty else ''} {names}"


def plan_changes(catalog: Catalog, policy: PolicySet) -> list[Change]:
    changes, _ = compute_plan(catalog.policy_state(), policy)
    return changes


def apply_policy(
    catalog: Catalog,
    policy: PolicySet,
    *,
    source: str,
    publisher: PolicyPublisher | None,
    applied_by: str | None = None,
    confirmed: Sequence[Change] | None = None,
) -> ApplyResult:
    """Apply `policy`; refuse stranding replicas; publish the head when a publisher is given.

    `confirmed`: the changes an operator agreed to (planned before the lock was taken).
    When the catalog moved meanwhile and the changes under the lock differ, nothing is
    applied (`ConflictError`): an apply never commits a change set nobody saw."""
    user = applied_by or getpass.getuser()
    planned: list[Change] = []
    placed: dict[str, Placement] = {}

    def decide(state: CatalogState) -> RevisionDraft:
        # Runs inside the catalog's transaction, on the state read under its lock.
        changes, placements = compute_plan(state, policy)
        if confirmed is not None and list(confirmed) != changes:
            raise ConflictError(
                "the catalog changed after the plan you confirmed (another `policy apply`, "
                "or a dataset registered by its first write); nothing was applied: run the "
                "command again to see the new plan"
            )
        planned[:] = changes
        placed.clear()
        placed.update(placements)  # what is published to etcd beside the rules
        return RevisionDraft(
            digest=policy.digest,
            document=policy.document(),
            regions=policy.regions,
            declared=policy.declared,
            placements=placements,
            changed=bool(changes),
        )

    outcome = catalog.apply_revision(decide, source=source, applied_by=user)
    revision, digest, applied_at = outcome.revision, outcome.digest, outcome.applied_at
    changes = planned
    published = False
    if publisher is not None and revision:
        compiled = CompiledPolicy.build(
            policy,
            placed,
            digest=digest,
            revision=revision,
            applied_at=applied_at,
            lineage=outcome.lineage,
        )
        asyncio.run(publisher.publish(compiled))
        published = True
    return ApplyResult(changes, revision, digest, applied_at, published)
