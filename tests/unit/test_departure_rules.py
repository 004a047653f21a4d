"""The rules of departed agents (agents/placement/departures.py): who departed, when a
settled rebalance may clear their roster entries, and how an entry's copies move."""

from __future__ import annotations

from agents.placement.departures import (
    RosterEntry,
    departed,
    entries_from,
    lowered,
    may_clear,
    refusal,
)


def entry(agent_id: str, copies: int = 2) -> RosterEntry:
    return RosterEntry(agent_id, copies, f"{agent_id}:1", "2026-12-03T00:00:00Z")


def test_departed_is_a_roster_entry_without_registration() -> None:
    roster = {"a": entry("a"), "b": entry("b"), "c": entry("c")}
    assert departed(roster, ["a"]) == ["b", "c"]
    assert departed(roster, ["a", "b", "c"]) == []
    # A registration without an entry (an agent of before this change) departs nothing.
    assert departed({"a": entry("a")}, ["a", "z"]) == []


def test_an_unreadable_entry_counts_as_departed_with_one_copy() -> None:
    found = entries_from({"a": entry("a", 3).value(), "b": b"not json", "c": b'{"id": "c"}'})
    assert found["a"] == entry("a", 3)
    assert found["b"].copies == 1
    assert found["c"].copies == 1
    assert RosterEntry.parse(entry("x", 2).value()) == entry("x", 2)


def test_clear_only_when_fewer_departed_than_the_smallest_copies() -> None:
    settled = {"c": True}
    roster = {"a": entry("a"), "b": entry("b"), "c": entry("c")}
    kept = may_clear(roster, ["c"], settled)
    assert kept.clear == ()
    assert "2 agents departed" in kept.reason
    one_gone = {"b": entry("b"), "c": entry("c"), "a": entry("a")}
    assert may_clear(one_gone, ["a", "c"], {"a": True, "c": True}).clear == ("b",)
    # The smallest copies any departed entry vouched for decides.
    low = {"a": entry("a", 1), "b": entry("b", 3), "c": entry("c", 3)}
    assert may_clear(low, ["b", "c"], {"b": True, "c": True}).clear == ()
    high = {"a": entry("a", 3), "b": entry("b", 3), "c": entry("c", 3), "d": entry("d", 3)}
    assert may_clear(high, ["c", "d"], {"c": True, "d": True}).clear == ("a", "b")


def test_clear_waits_for_every_registered_agent_to_settle() -> None:
    roster = {"a": entry("a"), "b": entry("b"), "c": entry("c")}
    waiting = may_clear(roster, ["a", "c"], {"a": True, "c": False})
    assert waiting.clear == ()
    assert "['c']" in waiting.reason
    assert may_clear(roster, ["a", "c"], {"a": True}).clear == ()  # unknown: not settled
    assert may_clear(roster, [], {}).clear == ()
    assert may_clear(roster, ["a", "b", "c"], {}).clear == ()  # nobody departed


def test_copies_are_lowered_never_raised() -> None:
    assert lowered(entry("a", 3), 2) == entry("a", 2)
    assert lowered(entry("a", 2), 2) is None
    assert lowered(entry("a", 2), 3) is None
    assert lowered(entry("a", 2), 0) is None


def test_refusal_names_the_departed_agents() -> None:
    message = refusal("eu-west", ["b", "a"])
    assert "a, b" in message
    assert "/meridian/roster/eu-west/" in message
