"""Convergence after heal: every region that must hold a dataset holds the same
(key, version, digest) fingerprint; the catalog agrees with the disks; lag is zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from chaos.checkers.verdict import Verdict
from chaos.records import ObjectState

NAME = "convergence"

Fingerprint = dict[str, tuple[str, str]]  # key -> (version, digest)


def check(
    final: Iterable[ObjectState],
    required_regions: Mapping[str, Sequence[str]],
    catalog: Iterable[ObjectState] | None = None,
    lag: Mapping[str, int] | None = None,
) -> Verdict:
    """`catalog`: the catalog's newest version per (region, object), when it is
    checked; `lag`: consumer lag (messages) per region's replicator."""
    disks: dict[tuple[str, str], Fingerprint] = {}
    for s in final:
        disks.setdefault((s.region, s.dataset), {})[s.key] = (s.version, s.digest)
    problems: list[str] = []
    for ds, regions in sorted(required_regions.items()):
        prints = {r: disks.get((r, ds), {}) for r in regions}
        if len({tuple(sorted(p.items())) for p in prints.values()}) <= 1:
            continue
        keys = sorted({k for p in prints.values() for k in p})
        for key in keys:
            seen = {r: p.get(key) for r, p in prints.items()}
            if len(set(seen.values())) > 1:
                shown = ", ".join(f"{r}={v[0] if v else 'absent'}" for r, v in sorted(seen.items()))
                problems.append(f"{ds}/{key} differs: {shown}")
    if catalog is not None:
        recorded: dict[tuple[str, str, str], str] = {
            (c.region, c.dataset, c.key): c.version for c in catalog
        }
        for (region, ds), fp in sorted(disks.items()):
            for key, (version, _digest) in sorted(fp.items()):
                got = recorded.get((region, ds, key))
                if got != version:
                    problems.append(
                        f"catalog says {region} holds {ds}/{key} at {got or 'nothing'}, "
                        f"the disk holds {version}"
                    )
    for region, behind in sorted((lag or {}).items()):
        if behind:
            problems.append(f"{region}'s replicator is {behind} events behind")
    return Verdict.of(NAME, problems, "every region holds the same versions")
