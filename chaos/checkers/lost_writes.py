"""Lost acknowledged writes (Jepsen's set-full, with last-writer-wins).

Every `ok` write must be present in every region its placement requires, or be
superseded there by a newer version (higher HLC) that some write of the run
produced (`ok` or `info`: an `info` write may have taken effect). A region that
holds an older version, nothing, or a newer version nobody wrote, loses it.

Writes are `f == "write"` operations whose completion carries `version` (the HLC
text, which sorts as the HLC) and whose invoke carries `digest`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from chaos.checkers.verdict import Verdict
from chaos.history import Operation
from chaos.records import ObjectState

NAME = "lost-acked-writes"


def check(
    operations: Iterable[Operation],
    final: Iterable[ObjectState],
    required_regions: Mapping[str, Sequence[str]],
    *,
    only_in: Callable[[Operation], Sequence[str] | None] | None = None,
    datasets: Set[str] | None = None,
    name: str = NAME,
) -> Verdict:
    """`required_regions`: dataset -> the regions that must hold its acked writes;
    `only_in(op)`, when it returns regions, narrows them for that write (a version the
    system must quarantine elsewhere, such as a skewed clock's); `datasets` limits the
    acked writes judged (every write still counts as a possible superseder)."""
    judged = judge(operations, final, required_regions, only_in=only_in, datasets=datasets)
    problems = [f"{op.describe()}: {why}" for op, faults in judged for _, why in faults]
    return Verdict.of(name, problems, f"{len(judged)} acked writes all present")


def judge(
    operations: Iterable[Operation],
    final: Iterable[ObjectState],
    required_regions: Mapping[str, Sequence[str]],
    *,
    only_in: Callable[[Operation], Sequence[str] | None] | None = None,
    datasets: Set[str] | None = None,
) -> list[tuple[Operation, list[tuple[str, str]]]]:
    """Every acked write judged, with the (region, why) of each required region that
    lost it (an empty list: kept everywhere it must be)."""
    held: dict[tuple[str, str, str], ObjectState] = {}
    for state in final:
        held[(state.region, state.dataset, state.key)] = state
    written: set[tuple[str, str, str]] = set()  # (dataset, key, version) maybe in effect
    # An `info` write has no version (its reply was lost), but its content is unique
    # (an id stamped in it), so its digest names it when it did take effect.
    written_digests: set[tuple[str, str, str]] = set()
    acked: list[Operation] = []
    for op in operations:
        if op.f != "write":
            continue
        version = op.seen("version")
        if op.outcome in ("ok", "info") and isinstance(version, str):
            written.add((op.invoke.dataset, op.invoke.key, version))
        digest = op.invoke.value.get("digest")
        if op.outcome in ("ok", "info") and isinstance(digest, str):
            written_digests.add((op.invoke.dataset, op.invoke.key, digest))
        if op.outcome == "ok" and (datasets is None or op.invoke.dataset in datasets):
            acked.append(op)
    out: list[tuple[Operation, list[tuple[str, str]]]] = []
    for op in acked:
        ds, key = op.invoke.dataset, op.invoke.key
        version = op.seen("version")
        narrowed = only_in(op) if only_in is not None else None
        regions = required_regions.get(ds, ()) if narrowed is None else narrowed
        faults: list[tuple[str, str]] = []
        out.append((op, faults))
        if not isinstance(version, str):
            faults.append(("", "acked without a version"))
            continue
        for region in regions:
            got = held.get((region, ds, key))
            if got is None:
                faults.append((region, f"absent in {region}"))
            elif got.version < version:
                faults.append((region, f"{region} holds the older {got.version} instead"))
            elif got.version == version:
                if got.digest != op.seen("digest"):
                    faults.append((region, f"{region} holds {version} with digest {got.digest}"))
            elif (ds, key, got.version) not in written and (
                (ds, key, got.digest) not in written_digests
            ):
                faults.append((region, f"{region} holds {got.version}, which no write produced"))
    return out
