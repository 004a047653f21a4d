"""The rules of spec/policy.md that span fields or documents (3 to 10 and 12).

Each check returns problems placed on the node a user must change. Rules 1, 2 and
11 are enforced while loading and parsing (`loader.py`, `documents.py`). A few checks
go beyond policy.md, each to stop a policy that plan, apply or the placer would fail
on or decide silently: a list entry given twice, a second link for the same pair of
regions, and equal priorities that leave a declared dataset's policy to a tie-break.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from controlplane.policy.documents import did_you_mean
from controlplane.policy.loader import RawDocument
from controlplane.policy.models import PolicySpec
from controlplane.policy.partial import (
    LooseDataset,
    LoosePolicy,
    LooseTopology,
    given,
    known_dict,
    known_list,
)
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


@dataclass(frozen=True)
class Regions:
    """The regions of the topology as far as they could be parsed: name -> jurisdiction
    (None when malformed). `exhaustive` is False when some region has no usable name,
    so that "not a region of the topology" cannot be claimed."""

    jurisdiction: dict[str, str | None]
    exhaustive: bool


def topology_regions(raw: RawDocument, model: LooseTopology) -> Regions | None:
    """The regions of a (possibly invalid) topology; None when its region list is unusable.

    A region with a malformed name still exists under the name written (its own error
    is reported), so references to it are not reported a second time."""
    spec = model.spec
    if spec is None or spec.regions is None:
        return None
    found: dict[str, str | None] = {}
    exhaustive = True
    for i, region in enumerate(spec.regions):
        name = region.name if region is not None else None
        if name is None:
            written = _at(raw.data, ("spec", "regions", i, "name"))
            name = written if isinstance(written, str) else None
        if name is None:
            exhaustive = False
            continue
        found.setdefault(name, region.jurisdiction if region is not None else None)
    return Regions(found, exhaustive)


def _at(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def check_topology(raw: RawDocument, model: LooseTopology) -> list[Problem]:
    """Rules 4 and 5 within the topology: duplicate regions, bad links."""
    spec = model.spec
    problems: list[Problem] = []
    if spec is None:
        return problems
    seen: set[str] = set()
    for i, region in enumerate(spec.regions or []):
        written = _at(raw.data, ("spec", "regions", i, "name"))
        name = region.name if region is not None and region.name is not None else written
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                raw.problem(("spec", "regions", i, "name"), f"duplicate region {name!r}")
            )
        seen.add(name)
    regions = topology_regions(raw, model)
    # The compiler keeps one link per pair of regions, whichever way round it is given.
    pairs: dict[frozenset[str], int] = {}
    for i, link in enumerate(spec.links or []):
        if link is None or link.between is None:
            continue
        if len(link.between) == 2 and None not in link.between:
            pair = frozenset(r for r in link.between if r is not None)
            first = pairs.setdefault(pair, i)
            if first != i and len(pair) == 2:
                a, b = link.between
                problems.append(
                    raw.problem(
                        ("spec", "links", i, "between"),
                        f"duplicate link between {a!r} and {b!r} (first given on line "
                        f"{raw.pos(('spec', 'links', first, 'between')).line})",
                    )
                )
        for j, name in enumerate(link.between):
            if name is None or regions is None or not regions.exhaustive:
                continue
            if name not in regions.jurisdiction:
                problems.append(
                    raw.problem(
                        ("spec", "links", i, "between", j),
                        f"link names region {name!r}, which the topology does not have"
                        + did_you_mean(name, regions.jurisdiction),
                    )
                )
        if len(link.between) == 2 and link.between[0] is not None:
            a, b = link.between
            if a == b:
                problems.append(
                    raw.problem(
                        ("spec", "links", i, "between"), f"link from region {a!r} to itself"
                    )
                )
    return problems


def check_policy(
    raw: RawDocument, model: LoosePolicy, blanked: Any, regions: Regions | None
) -> list[Problem]:
    """Rules 5 to 9 for one policy, as far as its fields could be parsed. `regions` is
    None when the topology is missing or unusable: the region-dependent rules are then
    skipped; so is every check whose inputs are unknown (None)."""
    spec = model.spec
    if spec is None:
        return []
    name = model.metadata.name if model.metadata is not None else None
    called = f"policy {name!r}" if name is not None else "this policy"
    problems: list[Problem] = []
    critical = spec.class_ == "critical"
    standard = spec.class_ == "standard"

    # Rule 8: rpo and ack against the class.
    if critical and spec.rpo is not None and spec.rpo != 0:
        problems.append(
            raw.problem(("spec", "rpo"), f"{called} is critical, so its rpo must be 0s")
        )
    if standard and spec.rpo is not None and spec.rpo == 0:
        problems.append(
            raw.problem(("spec", "rpo"), f"{called} is standard, so its rpo must be > 0s")
        )
    if standard and spec.ack is not None:
        problems.append(
            raw.problem(
                ("spec", "ack"),
                f"{called} is standard: ack applies only to critical",
                key=True,
            )
        )

    # Rule 7 (shape): exactly one of count and regions.
    reps = spec.replicas
    if reps is not None:
        has_count = _stated(raw, blanked, ("spec", "replicas", "count"))
        has_regions = _stated(raw, blanked, ("spec", "replicas", "regions"))
        if has_count and has_regions:
            problems.append(
                raw.problem(
                    ("spec", "replicas"), "give replicas.count or replicas.regions, not both"
                )
            )
        if not has_count and not has_regions:
            problems.append(
                raw.problem(("spec", "replicas"), "give one of replicas.count or replicas.regions")
            )
        elif has_regions and critical and isinstance(reps.regions, list) and not reps.regions:
            # Not in policy.md: a critical dataset with no replica has no copy to fail
            # over to nor a quorum to ack with (a standard one may keep a single copy).
            problems.append(
                raw.problem(
                    ("spec", "replicas", "regions"),
                    f"{called} is critical, so replicas.regions needs at least one region",
                )
            )
    replica_regions = (reps.regions if reps is not None else None) or []
    order = (spec.failover.order if spec.failover is not None else None) or []

    # Not in policy.md, but a placement refuses a list that names something twice, so
    # plan and apply would fail on it later, without a position.
    for at, noun, listed in (
        (("spec", "replicas", "regions"), "replica region", replica_regions),
        (("spec", "failover", "order"), "failover candidate", order),
        (("spec", "residency"), "jurisdiction", spec.residency or []),
    ):
        problems.extend(_repeated(raw, at, noun, listed, called))

    # Rule 9: home in its own replicas or failover order.
    for field, listed in (("replicas", replica_regions), ("failover", order)):
        sub = "regions" if field == "replicas" else "order"
        for i, region in enumerate(listed):
            if region is not None and region == spec.home:
                problems.append(
                    raw.problem(
                        ("spec", field, sub, i),
                        f"home {region!r} is listed in its own {field}.{sub}",
                    )
                )

    if regions is None:
        return problems
    residency = set(r for r in spec.residency or [] if r is not None)
    residency_known = known_list(spec.residency)

    def region_refs() -> Iterable[tuple[tuple[str | int, ...], str, str]]:
        if spec.home is not None:
            yield ("spec", "home"), spec.home, "home"
        for i, r in enumerate(replica_regions):
            if r is not None:
                yield ("spec", "replicas", "regions", i), r, "replica region"
        for i, r in enumerate(order):
            if r is not None:
                yield ("spec", "failover", "order", i), r, "failover candidate"

    # Rules 5 and 6: unknown regions, regions outside residency.
    for path, region, role in region_refs():
        if region not in regions.jurisdiction:
            if regions.exhaustive:
                problems.append(
                    raw.problem(
                        path,
                        f"{role} {region!r} of {called} is not a region of the topology"
                        + did_you_mean(region, regions.jurisdiction),
                    )
                )
            continue
        where = regions.jurisdiction[region]
        if residency_known and where is not None and where not in residency:
            problems.append(
                raw.problem(
                    path,
                    f"{role} {region!r} (jurisdiction {where}) is outside the "
                    f"residency {sorted(residency)} of {called}",
                )
            )

    # Rule 7 (size): count no larger than the allowed regions besides home. Regions of
    # unknown jurisdiction might be allowed, so they count as allowed here.
    count = reps.count if reps is not None else None
    if count is not None and residency_known and regions.exhaustive and spec.home is not None:
        allowed = [
            r
            for r, j in regions.jurisdiction.items()
            if r != spec.home and (j is None or j in residency)
        ]
        if count > len(allowed):
            problems.append(
                raw.problem(
                    ("spec", "replicas", "count"),
                    f"replicas.count is {count} but residency {sorted(residency)} allows "
                    f"only {len(allowed)} region(s) besides home in {called}",
                )
            )
    return problems


def _stated(raw: RawDocument, blanked: Any, path: tuple[str | int, ...]) -> bool:
    """Whether a field is given, valid or not. An explicit null (`count: ~`, or `count:`
    with nothing after) means "no count", as an absent field does; a misspelt field
    (blanked in as None, not in the raw document) counts as given, value unknown."""
    parent = _at(raw.data, path[:-1])
    if isinstance(parent, dict) and path[-1] in parent and parent[path[-1]] is None:
        return False
    return given(blanked, path)


def _repeated(
    raw: RawDocument,
    path: tuple[str | int, ...],
    noun: str,
    listed: list[str | None],
    called: str,
) -> list[Problem]:
    """A problem at each entry of `listed` that repeats an earlier one."""
    problems: list[Problem] = []
    first: dict[str, int] = {}
    dotted = ".".join(str(p) for p in path[1:])
    for i, item in enumerate(listed):
        if item is None:
            continue
        if item in first:
            line = raw.pos((*path, first[item])).line
            problems.append(
                raw.problem(
                    (*path, i),
                    f"{noun} {item!r} is listed twice in {dotted} of {called} "
                    f"(first on line {line})",
                )
            )
        first.setdefault(item, i)
    return problems


def check_policy_set(policies: list[tuple[RawDocument, LoosePolicy]]) -> list[Problem]:
    """Rules 4 and 10 across policies: duplicate names, equal priority with the same glob."""
    problems: list[Problem] = []
    names: set[str] = set()
    globs: dict[tuple[int, str], str] = {}
    for raw, model in policies:
        name = model.metadata.name if model.metadata is not None else None
        if name is not None and name in names:
            problems.append(raw.problem(("metadata", "name"), f"duplicate policy name {name!r}"))
        if name is not None:
            names.add(name)
        spec = model.spec
        if name is None or spec is None or spec.priority is None or spec.selector is None:
            continue
        for i, glob in enumerate(spec.selector.datasets or []):
            if glob is None:
                continue
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


def selector_known(model: LoosePolicy) -> bool:
    """Whether a policy's selector was parsed in full (so a non-match is certain)."""
    selector = model.spec.selector if model.spec is not None else None
    return selector is not None and known_list(selector.datasets) and known_dict(selector.labels)


def loosely_selects(model: LoosePolicy, dataset: str, labels: dict[str, str]) -> bool:
    selector = model.spec.selector if model.spec is not None else None
    if selector is None:
        return False
    if not any(g is not None and fnmatchcase(dataset, g) for g in selector.datasets or []):
        return False
    return all(labels.get(k) == v for k, v in (selector.labels or {}).items())


def check_datasets(
    datasets: list[tuple[RawDocument, LooseDataset]],
    policies: list[LoosePolicy],
    *,
    all_policies: bool = True,
) -> list[Problem]:
    """Rule 12: every declared dataset selected by some policy; no duplicate names.
    "Selected by no policy" is said only when every policy's selector is known
    (`all_policies`) and so are the dataset's labels."""
    problems: list[Problem] = []
    seen: set[str] = set()
    certain = all_policies and all(selector_known(p) for p in policies)
    for raw, model in datasets:
        meta = model.metadata
        if meta is None or meta.name is None:
            continue
        if meta.name in seen:
            problems.append(raw.problem(("metadata", "name"), f"duplicate dataset {meta.name!r}"))
        seen.add(meta.name)
        if not certain or not known_dict(meta.labels):
            continue
        labels = {k: v for k, v in (meta.labels or {}).items() if v is not None}
        if not any(loosely_selects(p, meta.name, labels) for p in policies):
            problems.append(
                raw.problem(("metadata", "name"), f"dataset {meta.name!r} is selected by no policy")
            )
    return problems
