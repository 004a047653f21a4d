"""`plan_eviction`: what a region dropped from a placement may lose, judged against the
placement's newest versions (controlplane/coordination/orchestration/evict.py)."""

from __future__ import annotations

from controlplane.coordination.orchestration.evict import plan_eviction
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version


def at(wall: int) -> HLC:
    return HLC(wall, 0, "eu-west")


def put(wall: int, body: bytes = b"x") -> Version:
    return Version.put(at(wall), len(body), Digest.of(body))


def test_only_what_the_placement_holds_at_that_version_or_newer_goes() -> None:
    here = {
        "same": put(10),
        "older": put(10),
        "deleted": Version.delete(at(20)),  # nothing elsewhere: what a delete leaves
        "only-here": put(10),  # nothing elsewhere: its only copy
        "newer-here": put(30),
        "collides": put(10, b"these bytes"),
    }
    elsewhere = {
        "same": put(10),
        "older": put(25),
        "newer-here": put(20),
        "collides": put(10, b"other bytes"),
    }
    evictable, kept = plan_eviction(here, elsewhere)
    assert evictable == [("deleted", at(20)), ("older", at(10)), ("same", at(10))]
    why = {k.key: k.why for k in kept}
    assert set(why) == {"only-here", "newer-here", "collides"}
    assert "only copy" in why["only-here"]
    assert "newer here" in why["newer-here"]
    assert "other bytes" in why["collides"]
    assert all(k.version == here[k.key].hlc.text for k in kept)
