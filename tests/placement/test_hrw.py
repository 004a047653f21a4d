"""The placement function (agents/placement/hrw.py): pinned, deterministic, weighted,
minimal movement."""

from __future__ import annotations

from collections import Counter

import pytest

from agents.placement import Member, Members, copies_for, hrw, placement_key


def agents(n: int, **weights: int) -> list[Member]:
    return [
        Member(f"a{i}", f"127.0.0.1:{7000 + i}", weight=weights.get(f"a{i}", 1)) for i in range(n)
    ]


def test_numbers_are_pinned() -> None:
    # Every agent and client must compute the same owners: these values are the contract.
    assert placement_key("ds", "k") == placement_key("ds", "k")
    assert placement_key("ds", "k") != placement_key("ds", "k2")
    assert hrw.mix64(0) == 0
    assert hrw.mix64(1) == 0x5692161D100B05E5
    four = agents(4)
    assert [m.agent_id for m in hrw.owners("corpus/web", "shard-000001", four, 2)] == [
        m.agent_id for m in hrw.owners("corpus/web", "shard-000001", list(reversed(four)), 2)
    ]


def test_r_owners_are_distinct_and_primary_first() -> None:
    five = agents(5)
    for i in range(200):
        got = hrw.owners("ds", f"k{i}", five, 3)
        assert len({m.agent_id for m in got}) == 3
        assert got == hrw.rank(placement_key("ds", f"k{i}"), five)[:3]
    assert len(hrw.owners("ds", "k", agents(1), 2)) == 1


def test_spread_is_even() -> None:
    eight = agents(8)
    counts = Counter(hrw.owners("ds", f"k{i}", eight, 1)[0].agent_id for i in range(16_000))
    mean = 16_000 / 8
    assert max(counts.values()) / mean < 1.06, counts


def test_leave_moves_only_what_the_leaver_held() -> None:
    six = agents(6)
    five = six[:-1]
    for i in range(3000):
        before = {m.agent_id for m in hrw.owners("ds", f"k{i}", six, 2)}
        after = {m.agent_id for m in hrw.owners("ds", f"k{i}", five, 2)}
        if "a5" in before:
            assert len(after - before) == 1 and before - after == {"a5"}
        else:
            assert after == before


def test_join_moves_only_to_the_joiner() -> None:
    five, six = agents(5), agents(6)
    moved = 0
    for i in range(3000):
        before = {m.agent_id for m in hrw.owners("ds", f"k{i}", five, 2)}
        after = {m.agent_id for m in hrw.owners("ds", f"k{i}", six, 2)}
        assert after - before <= {"a5"}
        moved += len(after - before)
    assert 0.9 < moved / (3000 * 2 / 6) < 1.1


def test_weights_are_honoured() -> None:
    four = agents(4, a0=2)
    counts = Counter(hrw.owners("ds", f"k{i}", four, 1)[0].agent_id for i in range(20_000))
    others = (counts["a1"] + counts["a2"] + counts["a3"]) / 3
    assert 1.85 < counts["a0"] / others < 2.15, counts
    assert not hrw.owners("ds", "k", [Member("z", "h:1", weight=0)], 1)


@pytest.mark.parametrize(
    ("serving", "configured", "r"), [(1, None, 1), (2, None, 2), (4, None, 2), (4, 3, 3), (2, 3, 2)]
)
def test_copies(serving: int, configured: int | None, r: int) -> None:
    assert copies_for(serving, configured) == r


def test_members_snapshot_skips_leaving_agents() -> None:
    m = Members(
        "eu-west",
        {
            "a": Member("a", "h:1"),
            "b": Member("b", "h:2", state="leaving"),
            "c": Member("c", "h:3"),
        },
    )
    assert [x.agent_id for x in m.serving] == ["a", "c"]
    assert m.r == 2
    assert set(m.owner_ids("ds", "k")) == {"a", "c"}


def test_registration_values() -> None:
    value = (
        b'{"id": "x", "endpoint": "h:1", "weight": 3, "objects": 4, "bytes": 5,'
        b' "rebalance": {"remaining_bytes": 7, "remaining_objects": 1}}'
    )
    member = Member.from_registration(value)
    assert member == Member("x", "h:1", 3, 4, 5, "serving", 7, 1)
    assert Member.from_registration(b"not json") is None
    assert Member.from_registration(b'{"endpoint": "h:1"}') is None
    assert Member.from_registration(b'{"id": "x", "endpoint": "h", "weight": -1}') == Member(
        "x", "h", 1
    )
