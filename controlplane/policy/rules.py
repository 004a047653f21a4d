"""The rules of spec/policy.md that span fields or documents (3 to 10 and 12).

Each check returns problems placed on the node a user must change. Rules 1, 2 and
11 are enforced while loading and parsing (`loader.py`, `documents.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from controlplane.policy.documents import did_you_mean
from controlplane.policy.loader import RawDocument
from controlplane.policy.models import DatasetDoc, PolicySpec, ReplicationPolicy, Topology
from controlplane.policy.problems import Problem


def selects(spec: PolicySpec, dataset: str, labels: dict[str, str]) -> bool:
    """Whether a policy's selector matches a dataset (any glob, and every label)."""
    if not any(fnmatchcase(dataset, glob) for glob in spec.selector.datasets):
        return False
    return all(labels.get(k) == v for k, v in spec.selector.labels.items())


def check_topology_count(
    kinds_seen: list[tuple[str, int, int]], first_file: str, *, complete: bool
) -> list[Problem]:
    """Rule 3: exactly one Topology. `kinds_seen` holds (file, line, col) of each
    `kind: Topology` node, valid or not, so an invalid topology is not reported as absent."""
    if not kinds_seen:
        if not complete:
            return []  # a file that failed to parse may hold it; its error is reported
        return [Problem(first_file, 1, 1, "no Topology document: exactly one is required")]
    return [
        Problem(f, line, col, "more than one Topology document: exactly one is allowed")
        for f, line, col in kinds_seen[1:]
    ]


def check_topology(raw: RawDocument, model: Topology) -> list[Problem]:
    """Rules 4 and 5 within the topology: duplicate regions, bad links."""
    spec = model.spec
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, region in enumerate(spec.regions):
        if region.name in seen:
            problems.append(
                raw.problem(("spec", "regions", i, "name"), f"duplicate region {region.name!r}")
            )
        seen.add(region.name)
    for i, link in enumerate(spec.links):
        a, b = link.between
        for j, name in enumerate(link.between):
            if name not in seen:
                problems.append(
                    raw.problem(
                        ("spec", "links", i, "between", j),
                        f"link names region {name!r}, which the topology does not have"
                        + did_you_mean(name, seen),
                    )
                )
        if a == b:
            problems.append(
                raw.problem(("spec", "links", i, "between"), f"link from region {a!r} to itself")
            )
    return problems


def check_policy(
    raw: RawDocument, model: ReplicationPolicy, regions: dict[str, str] | None
) -> list[Problem]:
    """Rules 5 to 9 for one policy. `regions` maps name -> jurisdiction (None if the
    topology is missing or invalid: the region-dependent rules are then skipped)."""
    spec = model.spec
    name = model.metadata.name
    problems: list[Problem] = []
    critical = spec.class_ == "critical"

    # Rule 8: rpo and ack against the class.
    if critical and spec.rpo != 0:
        problems.append(
            raw.problem(("spec", "rpo"), f"policy {name!r} is critical, so its rpo must be 0s")
        )
    if not critical and spec.rpo == 0:
        problems.append(
            raw.problem(("spec", "rpo"), f"policy {name!r} is standard, so its rpo must be > 0s")
        )
    if not critical and spec.ack is not None:
        problems.append(
            raw.problem(
                ("spec", "ack"),
                f"policy {name!r} is standard: ack applies only to critical",
                key=True,
            )
        )

    # Rule 7 (shape): exactly one of count and regions.
    reps = spec.replicas
    if reps.count is not None and reps.regions is not None:
        problems.append(
            raw.problem(("spec", "replicas"), "give replicas.count or replicas.regions, not both")
        )
    if reps.count is None and reps.regions is None:
        problems.append(
            raw.problem(("spec", "replicas"), "give one of replicas.count or replicas.regions")
        )

    # Rule 9: home in its own replicas or failover order.
    for i, region in enumerate(reps.regions or []):
        if region == spec.home:
            problems.append(
                raw.problem(
                    ("spec", "replicas", "regions", i),
                    f"home {region!r} is listed in its own replicas.regions",
                )
            )
    for i, region in enumerate(spec.failover.order or []):
        if region == spec.home:
            problems.append(
                raw.problem(
                    ("spec", "failover", "order", i),
                    f"home {region!r} is listed in its own failover.order",
                )
            )

    if regions is None:
        return problems
    residency = set(spec.residency)

    def region_refs() -> Iterable[tuple[tuple[str | int, ...], str, str]]:
        yield ("spec", "home"), spec.home, "home"
        for i, r in enumerate(reps.regions or []):
            yield ("spec", "replicas", "regions", i), r, "replica region"
        for i, r in enumerate(spec.failover.order or []):
            yield ("spec", "failover", "order", i), r, "failover candidate"

    # Rules 5 and 6: unknown regions, regions outside residency.
    for path, region, role in region_refs():
        if region not in regions:
            problems.append(
                raw.problem(
                    path,
                    f"{role} {region!r} of policy {name!r} is not a region of the topology"
                    + did_you_mean(region, regions),
                )
            )
        elif regions[region] not in residency:
            problems.append(
                raw.problem(
                    path,
                    f"{role} {region!r} (jurisdiction {regions[region]}) is outside the "
                    f"residency {sorted(residency)} of policy {name!r}",
                )
            )

    # Rule 7 (size): count no larger than the allowed regions besides home.
    if reps.count is not None:
        allowed = [r for r, j in regions.items() if j in residency and r != spec.home]
        if reps.count > len(allowed):
            problems.append(
                raw.problem(
                    ("spec", "replicas", "count"),
                    f"replicas.count is {reps.count} but residency {sorted(residency)} allows "
                    f"only {len(allowed)} region(s) besides home in policy {name!r}",
                )
            )
    return problems


def check_policy_set(policies: list[tuple[RawDocument, ReplicationPolicy]]) -> list[Problem]:
    """Rules 4 and 10 across policies: duplicate names, equal priority with the same glob."""
    problems: list[Problem] = []
    names: set[str] = set()
    globs: dict[tuple[int, str], str] = {}
    for raw, model in policies:
        name = model.metadata.name
        if name in names:
            problems.append(raw.problem(("metadata", "name"), f"duplicate policy name {name!r}"))
        names.add(name)
        spec = model.spec
        for i, glob in enumerate(spec.selector.datasets):
            key = (spec.priority, glob)
            other = globs.get(key)
            if other is not None and other != name:
                problems.append(
                    raw.problem(
                        ("spec", "selector", "datasets", i),
                        f"policies {other!r} and {name!r} have equal priority "
                        f"{spec.priority} and the same dataset glob {glob!r}",
                    )
                )
            globs.setdefault(key, name)
    return problems


def check_datasets(
    datasets: list[tuple[RawDocument, DatasetDoc]],
    policies: list[ReplicationPolicy],
    *,
    all_policies: bool = True,
) -> list[Problem]:
    """Rule 12: every declared dataset selected by some policy; no duplicate names."""
    problems: list[Problem] = []
    seen: set[str] = set()
    specs = [p.spec for p in policies]
    for raw, model in datasets:
        meta = model.metadata
        if meta.name in seen:
            problems.append(raw.problem(("metadata", "name"), f"duplicate dataset {meta.name!r}"))
        seen.add(meta.name)
        if all_policies and not any(selects(spec, meta.name, meta.labels) for spec in specs):
            problems.append(
                raw.problem(("metadata", "name"), f"dataset {meta.name!r} is selected by no policy")
            )
    return problems
