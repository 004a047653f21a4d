"""The placement planner: policies, topology and datasets in, one placement per dataset out.

Pure and deterministic. A dataset is governed by the matching policy with the
highest priority (ties broken by policy name). `replicas.count` takes the regions
nearest to home by link RTT among those residency allows, ties broken by region
name; a region without a link to home counts as farthest. A placement never holds a
region outside its residency: the validator refuses such policies and the planner
only ever draws from allowed regions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from controlplane.domain.placement import Placement
from controlplane.policy.models import PolicySpec, ReplicationPolicy, Topology
from controlplane.policy.rules import selects


def rtt_table(topology: Topology) -> dict[frozenset[str], float]:
    table: dict[frozenset[str], float] = {}
    for link in topology.spec.links:
        if link.rtt is not None:
            table[frozenset(link.between)] = link.rtt
    return table


def policy_terms(spec: PolicySpec) -> dict[str, Any]:
    """The placement fields a policy gives every dataset it governs, whichever its regions
    (keyword arguments of `Placement`)."""
    return {
        "rpo_s": spec.rpo,
        "ack": spec.ack,
        "transfer_compression": spec.transfer.compression,
        "transfer_bandwidth_bps": spec.transfer.bandwidth,
        "deletes": spec.deletes,
    }


def document_terms(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`policy_terms` of each policy (by name) of a revision's stored document."""
    policies: Mapping[str, Mapping[str, Any]] = document.get("policies", {})
    return {
        name: policy_terms(
            PolicySpec.model_validate({k: v for k, v in spec.items() if v is not None})
        )
        for name, spec in policies.items()
    }


def governing_policy(
    policies: list[ReplicationPolicy], dataset: str, labels: Mapping[str, str]
) -> ReplicationPolicy | None:
    matching = [p for p in policies if selects(p.spec, dataset, dict(labels))]
    if not matching:
        return None
    return min(matching, key=lambda p: (-p.spec.priority, p.metadata.name))


def place(
    topology: Topology,
    policies: list[ReplicationPolicy],
    datasets: Mapping[str, Mapping[str, str]],
) -> dict[str, Placement]:
    """The placement of every dataset (name -> labels) that some policy selects."""
    jurisdiction = {r.name: r.jurisdiction for r in topology.spec.regions}
    rtt = rtt_table(topology)
    out: dict[str, Placement] = {}
    for name in sorted(datasets):
        labels = dict(datasets[name])
        policy = governing_policy(policies, name, labels)
        if policy is None:
            continue
        spec = policy.spec
        residency = tuple(spec.residency)
        if spec.replicas.regions is not None:
            replicas = tuple(spec.replicas.regions)
        else:
            count = spec.replicas.count or 0
            candidates = [r for r, j in jurisdiction.items() if r != spec.home and j in residency]
            candidates.sort(key=lambda r: (rtt.get(frozenset((spec.home, r)), math.inf), r))
            replicas = tuple(candidates[:count])
        order = tuple(spec.failover.order) if spec.failover.order is not None else replicas
        out[name] = Placement(
            dataset=name,
            policy=policy.metadata.name,
            dataset_class=spec.class_,
            home=spec.home,
            replicas=replicas,
            residency=residency,
            failover_mode=spec.failover.mode,
            failover_order=order,
            labels=labels,
            **policy_terms(spec),
        )
    return out
