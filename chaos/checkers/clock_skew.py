"""Clock skew: no region applied a version further ahead of its clock than allowed.

From the replicators' apply records (each with the applier's wall time `t`): a
version whose HLC `wall_ms` is more than `max_clock_skew_ms` ahead of `t` must be
quarantined (dead letter `clock skew`, recorded `refused`), never `applied`; so a
region whose clock runs ahead cannot win every later conflict. When the run was
meant to skew a clock, at least one event must have been refused, or the fault did
not bite and the scenario proved nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from chaos.checkers.verdict import Verdict
from chaos.records import ApplyRecord

NAME = "skewed-versions-quarantined"


def wall_ms(version: str) -> int | None:
    """The `wall_ms` of an HLC text (`%013d.%05d@region`), None if it is not one."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def check(
    applies: Iterable[ApplyRecord], max_skew_ms: int, *, expect_quarantine: bool = True
) -> Verdict:
    problems: list[str] = []
    refused_ahead = 0
    for a in applies:
        wall = wall_ms(a.version)
        if wall is None:
            continue
        ahead = wall - int(a.t * 1000)
        if ahead <= max_skew_ms:
            continue
        if a.outcome == "applied":
            problems.append(
                f"{a.region} applied {a.dataset}/{a.key} {a.version}, {ahead} ms ahead of its "
                f"clock (max_clock_skew_ms {max_skew_ms})"
            )
        elif a.outcome == "refused":
            refused_ahead += 1
    if expect_quarantine and refused_ahead == 0:
        problems.append("no version ahead of its receiver's clock was quarantined: no skew bit")
    return Verdict.of(NAME, problems, f"{refused_ahead} skewed events quarantined, none applied")
