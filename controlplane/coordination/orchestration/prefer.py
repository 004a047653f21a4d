"""Pure rules of the failover's preference for candidates that hold every acked version.

An acked critical write is held by at least `ack` regions. When the owner is lost,
what the surviving holders hold together (newest version of each object, by HLC)
covers every acked version as long as one holder of each is alive: always with
`ack: quorum` and a majority of home + replicas alive. So a candidate lacking
nothing of that union holds every acked version, and the RPO exposure of moving
to a candidate is what it lacks of the union. The union can also hold versions
that were never acked (a push that reached one replica of a write whose ack
failed): the exposure counted is then an upper bound, never an under-count.

No I/O here: the listings come from the agents (controller/holdings_choice.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.version import Version

Listing = Mapping[str, Version]  # key -> newest version held (tombstones included)


@dataclass(frozen=True, slots=True)
class Standing:
    """What one candidate region lacks of the live holders' union; `missing` is None
    when it could not be told (no record, its agent did not answer)."""

    region: str
    missing: tuple[str, ...] | None

    @property
    def lacks(self) -> int | None:
        return None if self.missing is None else len(self.missing)


@dataclass(frozen=True, slots=True)
class Assessment:
    """The standing of each candidate, and how it was told: `"records"` (every live
    holder published the same digest) or `"listings"` (the agents were listed)."""

    standings: dict[str, Standing]
    source: str
    holders: tuple[str, ...]  # regions with a live record


@dataclass(frozen=True, slots=True)
class Exposure:
    """The RPO exposure of a move, as the agents' records told it before the move:
    `missing` names (`key@hlc`) what the target lacks of the union of the live
    holders; `source` is "records" (equal digests: nothing listed) or "listings";
    `holders` the regions whose agents had a live record."""

    missing: tuple[str, ...]
    source: str
    holders: tuple[str, ...]
    passed_over: tuple[str, ...] = ()  # earlier candidates that lacked more

    def facts(self) -> dict[str, object]:
        return {
            "rpo_source": f"agents ({self.source})",
            "rpo_holders": list(self.holders),
            "passed_over": list(self.passed_over),
        }


def union_newest(listings: Iterable[Listing]) -> dict[str, Version]:
    """The newest version of each object among `listings` (highest HLC wins)."""
    out: dict[str, Version] = {}
    for listing in listings:
        for key, version in listing.items():
            have = out.get(key)
            if have is None or version.hlc > have.hlc:
                out[key] = version
    return out


def forgotten_deletes(union: Mapping[str, Version], listings: Iterable[Listing]) -> set[str]:
    """The keys whose newest version in `union` is a delete that no listing shows an
    older version of: a holder with nothing of such a key reads as the delete does
    (no object), which is what a region that forgot an expired delete holds
    (agents/daemon/expiry.py). Where a listing still shows an older put, holding
    nothing is lacking the delete: a takeover there could adopt that put."""
    older: set[str] = set()
    for listing in listings:
        for key, version in listing.items():
            want = union.get(key)
            if want is not None and version.hlc < want.hlc:
                older.add(key)
    return {k for k, v in union.items() if v.is_tombstone and k not in older}


def missing_from(
    union: Mapping[str, Version], held: Listing, forgotten: Collection[str] = ()
) -> tuple[str, ...]:
    """`key@hlc` of each object whose newest version in `union` `held` does not hold
    (its own newest is older, or the same HLC with other bytes), by key; a key of
    `forgotten` (forgotten_deletes) `held` has nothing of is not missing."""
    out: list[str] = []
    for key in sorted(union):
        want = union[key]
        have = held.get(key)
        if have is None and key in forgotten:
            continue
        if (
            have is None
            or have.hlc < want.hlc
            or (have.hlc == want.hlc and have.digest != want.digest)
        ):
            out.append(f"{key}@{want.hlc}")
    return tuple(out)


def choose(order: Sequence[str], standings: Mapping[str, Standing]) -> str:
    """The candidate to move to: of those whose standing is known, the first in `order`
    (home, then failover.order) lacking the fewest versions; when none is known, the
    first in `order`. `order` must not be empty."""
    if not order:
        raise ValueError("choose needs at least one candidate")
    known = [
        (s.lacks, i, r)
        for i, r in enumerate(order)
        if (s := standings.get(r)) and s.lacks is not None
    ]
    if not known:
        return order[0]
    return min(known)[2]
