"""When a region's copies of a dataset may not be evicted (`meridian dataset evict`).

One rule, judged twice on what each judge sees: by the CLI before it proves anything,
and by each agent of the region before it drops anything (the policy or the owner may
have moved since the CLI looked). Refused while the applied policy places the dataset
in the region (a copy region or a failover candidate), and while etcd names the region
the dataset's owner or a handover's target: an owner outside its placement (a policy
applied after a failover) still takes writes, and its store is what a replica's
catch-up copies from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from controlplane.domain.placement import Placement


@dataclass(frozen=True, slots=True)
class OwnerSeen:
    """The dataset's owner as etcd names it: its region, epoch and a handover's target."""

    region: str
    epoch: int
    handover_to: str | None = None


def eviction_refused(
    placement: Placement, region: str, owner: OwnerSeen | None, *, seen_by: str = ""
) -> str | None:
    """Why `region` may not evict its copies of the dataset (None: it may). `seen_by`
    names a judge other than the CLI in the answer ("this agent")."""
    dataset = placement.dataset
    seen = f", as {seen_by} sees it" if seen_by else ""
    if region in (*placement.regions, *placement.failover_order):
        return (
            f"dataset {dataset}: the applied policy (policy {placement.policy}{seen}) still "
            f"places it in {region}; apply a policy without {region} first, then evict"
        )
    if owner is not None and region in (owner.region, owner.handover_to):
        return (
            f"dataset {dataset}: etcd names {region} its owner (epoch {owner.epoch}) or a "
            "handover's target; `meridian switchover` it to a region of its placement first"
        )
    return None


def placement_digest(placement: Placement) -> str:
    """A fingerprint of the placement a proof was made under (SHA-256 of its canonical
    JSON): the agent compares its own with it. Not the policy's revision, whose number
    another catalog lineage (or a restored catalog) can give to another policy, and
    which an unrelated apply moves."""
    text = json.dumps(placement.as_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
