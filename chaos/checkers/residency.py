"""Residency: no copy of any byte of a dataset in a region outside its residency.

The inventory covers every agent's files (temporary ones too), the catalog's
replicas and transfers, and the dead-letter topic's payloads. A copy whose
dataset cannot be attributed (a temporary file named by a hash) is a violation
unless its region may hold every dataset of the run: unknown bytes are assumed to
be the worst ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from chaos.checkers.verdict import Verdict
from chaos.records import Copy, OwnerSample

NAME = "residency"
OWNERS = "owners-within-residency"


def check(
    inventory: Iterable[Copy],
    residency: Mapping[str, Set[str]],
    jurisdiction: Mapping[str, str],
) -> Verdict:
    """`residency`: dataset -> allowed jurisdictions; `jurisdiction`: region -> its own."""
    problems: list[str] = []
    count = 0
    for c in inventory:
        count += 1
        where = jurisdiction.get(c.region)
        if where is None:
            problems.append(f"{c.kind} {c.where} in unknown region {c.region}")
            continue
        if c.dataset is None:
            bad = sorted(ds for ds, allowed in residency.items() if where not in allowed)
            if bad:
                problems.append(
                    f"unattributed {c.kind} {c.where} in {c.region} ({where}), which may not "
                    f"hold {', '.join(bad[:3])}"
                )
            continue
        allowed = residency.get(c.dataset)
        if allowed is None:
            problems.append(f"{c.kind} of ungoverned dataset {c.dataset} in {c.region}")
        elif where not in allowed:
            problems.append(
                f"{c.kind} of {c.dataset}/{c.key} in {c.region} ({where}); residency is "
                f"{', '.join(sorted(allowed))} ({c.where})"
            )
    return Verdict.of(NAME, problems, f"{count} copies inventoried, all within residency")


def owners(
    samples: Iterable[OwnerSample],
    residency: Mapping[str, Set[str]],
    jurisdiction: Mapping[str, str],
) -> Verdict:
    """No dataset was ever owned (in etcd's owner records) by a region outside its
    residency: a failover with only non-compliant regions reachable must wait."""
    problems: list[str] = []
    seen: set[tuple[str, str, int]] = set()
    for s in samples:
        allowed = residency.get(s.dataset)
        if allowed is None or (s.dataset, s.region, s.epoch) in seen:
            continue
        seen.add((s.dataset, s.region, s.epoch))
        where = jurisdiction.get(s.region)
        if where not in allowed:
            problems.append(
                f"{s.dataset} owned by {s.region} ({where}) at epoch {s.epoch} from t={s.t:.3f}; "
                f"its residency is {', '.join(sorted(allowed))}"
            )
    owned = len({ds for ds, _, _ in seen})
    return Verdict.of(OWNERS, problems, f"{owned} datasets only ever owned within residency")
