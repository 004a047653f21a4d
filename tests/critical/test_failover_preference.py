"""The failover's preference for the candidate holding every acked version (pure rules):
the union of what the live holders hold, what each candidate lacks of it, and the
choice (fewest lacking, then home and failover.order)."""

from __future__ import annotations

from controlplane.coordination.orchestration.prefer import (
    Standing,
    choose,
    forgotten_deletes,
    missing_from,
    union_newest,
)
from controlplane.coordination.protocols.holdings import listing_digest
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version


def v(wall: int, fill: str = "a") -> Version:
    return Version(HLC(wall, 0, "eu-west"), "put", 1, Digest.parse("blake3:" + fill * 64))


def test_the_union_keeps_the_newest_of_each_object_and_a_lagging_holder_lacks_it() -> None:
    central = {"a": v(2), "b": v(1)}
    north = {"a": v(1), "c": v(3)}
    union = union_newest([central, north])
    assert union == {"a": v(2), "b": v(1), "c": v(3)}
    assert missing_from(union, central) == (f"c@{v(3).hlc}",)
    assert missing_from(union, north) == (f"a@{v(2).hlc}", f"b@{v(1).hlc}")
    # The same HLC with other bytes is lacking too.
    assert missing_from({"a": v(2)}, {"a": v(2, "b")}) == (f"a@{v(2).hlc}",)
    assert missing_from(union, union) == ()


def test_a_delete_is_missing_only_where_an_older_version_may_still_show() -> None:
    gone = Version(HLC(5, 0, "eu-west"), "delete", 0, None)
    listings: list[dict[str, Version]] = [{"a": gone, "b": gone}, {"b": gone}, {}]
    union = union_newest(listings)
    assert union == {"a": gone, "b": gone}
    # Holding nothing of them reads as the deletes do (a region that forgot an expired
    # delete): nothing lost.
    forgotten = forgotten_deletes(union, listings)
    assert forgotten == {"a", "b"}
    assert missing_from(union, {}, forgotten) == ()
    # A live holder still showing the older put of `a` (it missed the delete): a
    # takeover by a region holding nothing of `a` could adopt that put.
    listings.append({"a": v(2)})
    forgotten = forgotten_deletes(union_newest(listings), listings)
    assert forgotten == {"b"}
    assert missing_from(union, {}, forgotten) == (f"a@{gone.hlc}",)
    assert missing_from(union, {"a": v(2)}, forgotten) == (f"a@{gone.hlc}",)


def test_the_candidate_lacking_fewest_wins_then_the_order() -> None:
    order = ["eu-central", "eu-north"]
    behind = {"eu-central": Standing("eu-central", ("x@1",)), "eu-north": Standing("eu-north", ())}
    assert choose(order, behind) == "eu-north"
    even = {"eu-central": Standing("eu-central", ()), "eu-north": Standing("eu-north", ())}
    assert choose(order, even) == "eu-central"
    # A candidate whose standing is unknown never beats a known one; all unknown: order.
    unknown = {
        "eu-central": Standing("eu-central", None),
        "eu-north": Standing("eu-north", ("x@1",)),
    }
    assert choose(order, unknown) == "eu-north"
    assert choose(order, {}) == "eu-central"


def test_the_listing_digest_tells_listings_apart() -> None:
    one = listing_digest([("a", "1", "d1"), ("b", "2", "d2")])
    assert one == listing_digest([("a", "1", "d1"), ("b", "2", "d2")])
    assert one != listing_digest([("a", "1", "d1"), ("b", "3", "d2")])
    assert one != listing_digest([("a", "1", "d1")])
    # Field boundaries count: ("ab", "c") is not ("a", "bc").
    assert listing_digest([("ab", "1", "")]) != listing_digest([("a", "b1", "")])


def test_the_switchover_waits_only_for_what_an_ack_may_have_covered() -> None:
    from agents.client import ObjectInfo
    from controlplane.controller.agent_probe import lacking, required

    def info(key: str, wall: int) -> ObjectInfo:
        return ObjectInfo("d", key, v(wall))

    owner = [info("a", 3), info("b", 2), info("c", 1)]
    target = [info("a", 1), info("b", 1), info("c", 1)]
    other = [info("a", 1), info("b", 2), info("c", 1)]
    # a@3 is held by the owner only (its pushes refused): never acked at 2 copies.
    # b@2 is held by the owner and the other replica: it may have been acked.
    need = required([owner, target, other], 2)
    assert lacking(need, target) == [f"b@{v(2).hlc}"]
    # With `ack: all` (3 copies) neither can have been acked.
    assert lacking(required([owner, target, other], 3), target) == []
