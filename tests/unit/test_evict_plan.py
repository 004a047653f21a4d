"""`plan_eviction`: what a region dropped from a placement may lose, judged against the
placement regions' listings (controlplane/coordination/orchestration/evict.py)."""

from __future__ import annotations

from agents.client import ObjectInfo
from controlplane.coordination.orchestration.evict import Proof, plan_eviction
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version

NOW = 1_000_000
RETENTION = 100_000


def at(wall: int) -> HLC:
    return HLC(wall, 0, "eu-west")


def put(wall: int, body: bytes = b"x") -> Version:
    return Version.put(at(wall), len(body), Digest.of(body))


def listing(**versions: Version) -> dict[str, ObjectInfo]:
    return {
        k.replace("_", "-"): ObjectInfo("d", k.replace("_", "-"), v) for k, v in versions.items()
    }


def plan(
    here: dict[str, ObjectInfo],
    *placement: dict[str, ObjectInfo],
    need: int = 1,
    retain: bool = False,
) -> tuple[list[str], dict[str, str]]:
    evictable, kept = plan_eviction(Proof(here, list(placement), need, RETENTION, retain, NOW))
    return [k for k, _ in evictable], {k.key: k.why for k in kept}


def test_a_copy_goes_where_the_placement_holds_it_or_newer_readable() -> None:
    here = listing(same=put(10), older=put(10), only_here=put(10), newer_here=put(30))
    here["collides"] = ObjectInfo("d", "collides", put(10, b"these bytes"))
    there = listing(same=put(10), older=put(25), newer_here=put(20))
    there["collides"] = ObjectInfo("d", "collides", put(10, b"other bytes"))
    gone, kept = plan(here, there)
    assert gone == ["older", "same"]
    assert "only copy" in kept["only-here"]
    assert "not replicated yet" in kept["newer-here"]
    assert "other bytes" in kept["collides"]
    # A copy there whose bytes were lost is no proof.
    lost = {"same": ObjectInfo("d", "same", put(10), missing=True)}
    assert plan(listing(same=put(10)), lost)[0] == []


def test_a_critical_copy_goes_only_once_the_ack_count_of_regions_holds_it() -> None:
    here = listing(k=put(10))
    assert plan(here, listing(k=put(10)), {}, need=2)[0] == []
    assert plan(here, listing(k=put(10)), listing(k=put(12)), need=2)[0] == ["k"]


def test_a_delete_held_nowhere_goes_only_once_expired_and_not_retained() -> None:
    old, young = Version.delete(at(NOW - RETENTION - 1)), Version.delete(at(NOW - 5))
    assert plan(listing(k=old), {})[0] == ["k"]  # what an expired delete leaves
    assert plan(listing(k=young), {})[0] == []  # the put may still be on its way
    # Exactly the retention old: not yet expired (the agents forget a delete strictly
    # older than the retention), so not shown held.
    assert plan(listing(k=Version.delete(at(NOW - RETENTION))), {})[0] == []
    assert plan(listing(k=old), {}, retain=True)[0] == []
    # A region still showing an older put: the delete is not what it holds.
    assert plan(listing(k=old), listing(k=put(10)))[0] == []
    # Retained deletes: a newer delete there is its own, never sent this put.
    assert plan(listing(k=put(10)), listing(k=Version.delete(at(20))), retain=True)[0] == []
    assert plan(listing(k=put(10)), listing(k=Version.delete(at(20))))[0] == ["k"]


def test_a_delete_held_nowhere_stays_while_the_placements_retention_is_unknown() -> None:
    """An agent of the placement that predates saying its retention: nothing expired."""
    here = listing(old_delete=Version.delete(at(10)))
    evictable, kept = plan_eviction(Proof(here, [{}], 1, None, False, NOW))
    assert evictable == [] and "not every agent of it could say it" in kept[0].why
    evictable, _ = plan_eviction(Proof(here, [{}], 1, RETENTION, False, NOW))
    assert [k for k, _ in evictable] == ["old-delete"]
