"""Datasets first seen after an apply: announced in etcd so that controllers learn them.

`policy apply` publishes the placements of the datasets it knows; a dataset that
first appears later (an agent's first write of `ckpt/run-7`) is placed by the
published rules, but no controller would claim or fail over a critical one, since
they only read the published placements. So the agent that first meets such a
dataset announces it under `/meridian/datasets/<name>` (create-if-absent, so the
first announcement stays), and controllers and runbooks take the announced names,
placed by the current rules, together with the published ones (`known_placements`).
An announcement carries no decision: where the dataset lives is always what the
current policy's rules say, so a new apply re-places it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from controlplane.coordination.protocols import keys
from controlplane.domain.names import check_name
from controlplane.domain.placement import Placement
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.coordination import Cmp, Compare, Coordination, Put, Target

log = get_logger("meridian.coordination")


async def announce(
    coord: Coordination, dataset: str, *, by: str, labels: Mapping[str, str] | None = None
) -> bool:
    """Record that `dataset` exists; True when this call made the announcement.

    Idempotent: a second announcement of the same name (from any region) changes
    nothing, so the first one's time and labels are kept."""
    check_name("dataset", dataset)
    key = keys.dataset(dataset)
    value = json.dumps(
        {"by": by, "first_seen_ms": int(time.time() * 1000), "labels": dict(labels or {})},
        sort_keys=True,
    ).encode()
    result = await coord.txn([Compare(key, Target.CREATE, Cmp.EQUAL, 0)], [Put(key, value)])
    if result.succeeded:
        log.info("dataset_announced", dataset=dataset, by=by)
    return result.succeeded


async def announced(coord: Coordination) -> dict[str, dict[str, str]]:
    """Every announced dataset with the labels it was announced with."""
    kvs, _ = await coord.get_prefix(keys.DATASETS)
    found: dict[str, dict[str, str]] = {}
    for kv in kvs:
        name = kv.key.removeprefix(keys.DATASETS)
        labels: dict[str, str] = {}
        try:
            doc = json.loads(kv.value)
            raw = doc.get("labels", {}) if isinstance(doc, dict) else {}
            labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        except ValueError:
            # A damaged value still names a dataset; placing it without labels is the
            # safe reading (the rules then match it by name only).
            log.warning("dataset_announcement_unreadable", key=kv.key)
        found[name] = labels
    return found


def placements_of(
    policy: CompiledPolicy, extra: Mapping[str, Mapping[str, str]]
) -> list[Placement]:
    """The published placements and those the rules give the announced datasets, by name.

    An announced dataset no rule selects is left out (nothing governs it: no
    controller acts on it, and agents refuse its writes)."""
    found = dict(policy.placements)
    for name, labels in extra.items():
        if name in found:
            continue
        placed = _placed(policy, name, labels)
        if placed is not None:
            found[name] = placed
    return [p for _, p in sorted(found.items())]


# Controllers ask every reconcile interval; placing by the rules runs the planner, so
# the answer is kept per policy revision (a new apply changes the digest).
_CACHE: dict[tuple[str, int, str, frozenset[tuple[str, str]]], Placement | None] = {}
_CACHE_MAX = 65_536


def _placed(policy: CompiledPolicy, name: str, labels: Mapping[str, str]) -> Placement | None:
    key = (policy.digest, policy.revision, name, frozenset(labels.items()))
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = policy.placement(name, labels)
    return _CACHE[key]


async def known_placements(coord: Coordination, policy: CompiledPolicy) -> list[Placement]:
    """`placements_of` the policy and what etcd holds announced now."""
    return placements_of(policy, await announced(coord))
