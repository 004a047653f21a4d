"""Committable offsets when events of one partition finish out of order."""

from __future__ import annotations

from replicator.offsets import OffsetTracker

TP = ("meridian.changes", 0)
OTHER = ("meridian.changes", 1)


def test_only_a_contiguous_prefix_of_done_offsets_is_committable() -> None:
    t = OffsetTracker()
    for off in (10, 11, 12, 13):
        t.take(TP, off)
    t.done(TP, 12)
    t.done(TP, 13)
    assert t.committable() == {}  # 10 and 11 are still in flight
    t.done(TP, 10)
    assert t.committable() == {TP: 10}
    t.committed(TP, 10)
    assert t.committable() == {}  # handed out already
    t.done(TP, 11)
    assert t.committable() == {TP: 13}
    assert t.in_flight() == 0


def test_partitions_are_independent_and_a_revoked_one_is_forgotten() -> None:
    t = OffsetTracker()
    t.take(TP, 0)
    t.take(OTHER, 5)
    t.done(OTHER, 5)
    assert t.committable() == {OTHER: 5}
    assert t.in_flight({TP}) == 1
    t.forget({TP})
    t.done(TP, 0)  # a job that outlived its partition's revocation
    assert t.committable() == {OTHER: 5}
    assert t.in_flight() == 0


def test_an_offset_said_done_twice_is_counted_once() -> None:
    # A run applied again (after a crash of the applier) says its offsets done again:
    # they must not stay behind in the tracker, nor hold anything back.
    t = OffsetTracker()
    tp = ("changes", 0)
    for off in (0, 1, 2):
        t.take(tp, off)
    t.done(tp, 0)
    t.done(tp, 0)
    t.done(tp, 1)
    t.done(tp, 0)
    assert t.committable() == {tp: 1}
    t.done(tp, 2)
    assert t.committable() == {tp: 2}
    assert t.in_flight() == 0
    assert t._parts[tp].done == set()
