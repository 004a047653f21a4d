"""The chaos checkers on hand-made histories: each must fail on a violation and pass otherwise."""

from __future__ import annotations

import pytest

from chaos.checkers import (
    changelog,
    convergence,
    journal,
    lost_writes,
    ownership,
    residency,
    split_brain,
    visibility,
)
from chaos.records import (
    AcceptRecord,
    ApplyRecord,
    Copy,
    ObjectState,
    OwnerSample,
    PublishedEvent,
    accepts_from_agent_log,
)

from .hist import Builder

REQ = {"ds": ["eu-west", "eu-central"]}


def held_by(version: str, key: str = "k", regions: tuple[str, ...] = ("eu-west", "eu-central")):
    return [ObjectState(r, "ds", key, version, f"d-{version}") for r in regions]


# -- lost acknowledged writes --------------------------------------------------------------
def test_acked_write_present_everywhere_holds() -> None:
    b = Builder()
    b.write("k", "v1")
    assert lost_writes.check(b.ops(), held_by("v1"), REQ).held


def test_acked_write_missing_in_one_region_is_lost() -> None:
    b = Builder()
    b.write("k", "v1")
    verdict = lost_writes.check(b.ops(), held_by("v1", regions=("eu-west",)), REQ)
    assert not verdict.held
    assert "absent in eu-central" in (verdict.detail or "")


def test_acked_write_replaced_by_older_version_is_lost() -> None:
    b = Builder()
    b.write("k", "v1", op_id="old")
    b.write("k", "v2", op_id="new")
    verdict = lost_writes.check(b.ops(), held_by("v1"), REQ)
    assert not verdict.held
    assert any("new" in o and "older v1" in o for o in verdict.offending)


def test_superseded_by_an_info_write_is_allowed_but_not_by_an_unwritten_version() -> None:
    b = Builder()
    b.write("k", "v1")
    b.write("k", "v2", outcome="info")
    assert lost_writes.check(b.ops(), held_by("v2"), REQ).held
    assert not lost_writes.check(b.ops(), held_by("v9"), REQ).held


def test_a_failed_write_does_not_justify_a_newer_version() -> None:
    b = Builder()
    b.write("k", "v1")
    b.op("write", "ds", "k", "fail", sent={"digest": "d-v2"}, seen={"version": "v2"})
    assert not lost_writes.check(b.ops(), held_by("v2"), REQ).held


def test_same_version_with_another_digest_is_lost() -> None:
    b = Builder()
    b.write("k", "v1", digest="good")
    assert not lost_writes.check(b.ops(), held_by("v1"), REQ).held


# -- split brain ---------------------------------------------------------------------------
def acc(region: str, epoch: int, t: float, ok: bool = True, ds: str = "ds") -> AcceptRecord:
    return AcceptRecord(ds, epoch, region, f"{region}-w", ok, t)


def test_one_owner_after_another_holds() -> None:
    log = [acc("eu-west", 5, 1.0), acc("eu-west", 5, 2.0), acc("eu-central", 9, 3.0)]
    log.append(acc("eu-west", 5, 4.0, ok=False))  # refused: no violation
    owners = [OwnerSample("ds", "eu-west", 5, 0.5), OwnerSample("ds", "eu-central", 9, 2.5)]
    assert split_brain.check(log, owners).held


def test_stale_epoch_accept_is_split_brain() -> None:
    log = [acc("eu-west", 5, 1.0), acc("eu-central", 9, 2.0), acc("eu-west", 5, 3.0)]
    verdict = split_brain.check(log)
    assert not verdict.held
    assert any("stale epoch 5" in o for o in verdict.offending)
    assert any("overlapping" in o for o in verdict.offending)


def test_two_regions_at_one_epoch_is_split_brain() -> None:
    verdict = split_brain.check([acc("eu-west", 5, 1.0), acc("eu-central", 5, 2.0)])
    assert not verdict.held
    assert "accepted from eu-west and eu-central" in (verdict.detail or "")


def test_accept_at_an_epoch_etcd_gave_another_region() -> None:
    owners = [OwnerSample("ds", "eu-central", 5, 0.5)]
    verdict = split_brain.check([acc("eu-west", 5, 1.0)], owners)
    assert not verdict.held


def test_owner_epoch_going_down_is_a_violation() -> None:
    owners = [OwnerSample("ds", "eu-west", 9, 1.0), OwnerSample("ds", "eu-west", 5, 2.0)]
    assert not split_brain.check([], owners).held


def test_datasets_are_independent() -> None:
    log = [acc("eu-west", 9, 1.0, ds="a"), acc("eu-central", 5, 1.5, ds="b")]
    assert split_brain.check(log).held


# -- residency -----------------------------------------------------------------------------
JUR = {"eu-west": "EU", "us-east": "US"}
RES = {"ds": {"EU"}, "open": {"EU", "US"}}


def test_copies_inside_residency_hold() -> None:
    inv = [
        Copy("eu-west", "ds", "k", "object", "objects/ds/k"),
        Copy("us-east", "open", "k", "tmp", "tmp/x"),
        Copy("eu-west", None, "", "tmp", "tmp/y"),
    ]
    assert residency.check(inv, RES, JUR).held


def test_a_temporary_file_outside_residency_is_a_violation() -> None:
    verdict = residency.check([Copy("us-east", "ds", "k", "tmp", "tmp/z")], RES, JUR)
    assert not verdict.held
    assert "tmp of ds/k in us-east" in (verdict.detail or "")


def test_an_unattributed_file_in_a_narrow_region_is_a_violation() -> None:
    assert not residency.check([Copy("us-east", None, "", "tmp", "tmp/q")], RES, JUR).held


def test_dlq_payloads_and_catalog_rows_count() -> None:
    for kind in ("dlq", "catalog_replica", "catalog_transfer"):
        copy = Copy("us-east", "ds", "k", kind, "x")  # type: ignore[arg-type]
        assert not residency.check([copy], RES, JUR).held


# -- partial visibility --------------------------------------------------------------------
def test_reads_of_written_versions_hold() -> None:
    b = Builder()
    b.write("k", "v1", digest="aaa")
    b.write("k", "v2", outcome="info", digest="bbb")
    b.op("read", "ds", "k", "ok", seen={"digest": "aaa"})
    b.op("read", "ds", "k", "ok", seen={"digest": "bbb"})
    b.op("read", "ds", "k", "ok", seen={"absent": True})
    assert visibility.check(b.ops()).held


def test_a_read_of_bytes_nobody_wrote_is_partial() -> None:
    b = Builder()
    b.write("k", "v1", digest="aaa")
    b.write("k", "v2", outcome="fail", digest="bbb")
    b.op("read", "ds", "k", "ok", seen={"digest": "bbb"})  # a failed write never took effect
    b.op("read", "ds", "k", "ok", seen={"digest": "torn"})
    verdict = visibility.check(b.ops())
    assert not verdict.held
    assert len(verdict.offending) == 2


def test_a_mixed_set_is_partial() -> None:
    b = Builder()
    b.op("commit_set", "ds", "", "ok", sent={"members": {"a": "a1", "b": "b1"}})
    b.op("commit_set", "ds", "", "ok", sent={"members": {"a": "a2", "b": "b2"}})
    b.op("read_set", "ds", "", "ok", seen={"members": {"a": "a2", "b": "b2"}})
    assert visibility.check(b.ops()).held
    b.op("read_set", "ds", "", "ok", seen={"members": {"a": "a2", "b": "b1"}})
    assert not visibility.check(b.ops()).held


# -- convergence ---------------------------------------------------------------------------
def test_same_fingerprints_converge() -> None:
    final = held_by("v2")
    catalog = list(final)
    assert convergence.check(final, REQ, catalog, {"eu-central": 0}).held


def test_divergent_region_catalog_and_lag_are_reported() -> None:
    final = [*held_by("v2", regions=("eu-west",)), *held_by("v1", regions=("eu-central",))]
    assert not convergence.check(final, REQ).held
    same = held_by("v2")
    assert not convergence.check(same, REQ, catalog=held_by("v1")).held
    assert not convergence.check(same, REQ, lag={"eu-central": 3}).held
    missing = held_by("v2", regions=("eu-west",))
    assert not convergence.check(missing, REQ).held


# -- change log ----------------------------------------------------------------------------
def pub(eid: str, version: str, offset: int) -> PublishedEvent:
    return PublishedEvent(eid, "ds", "k", version, "eu-west", 0, offset)


def app(eid: str, version: str, t: float, outcome: str = "applied") -> ApplyRecord:
    return ApplyRecord("eu-central", eid, "ds", "k", version, outcome, t)  # type: ignore[arg-type]


def test_each_event_once_in_order_holds() -> None:
    events = [pub("e1", "v1", 0), pub("e2", "v2", 1)]
    applies = [app("e1", "v1", 1.0), app("e2", "v2", 2.0), app("e2", "v2", 3.0, "superseded")]
    assert changelog.check(events, applies, REQ).held


def test_a_replay_after_a_crash_is_no_second_effect_and_no_disorder() -> None:
    events = [pub("e1", "v1", 0), pub("e2", "v2", 1)]
    applies = [
        app("e1", "v1", 1.0),
        app("e2", "v2", 2.0),
        app("e1", "v1", 3.0, "superseded"),  # re-read from the committed offset
        app("e2", "v2", 4.0, "superseded"),
    ]
    assert changelog.check(events, applies, REQ).held
    applied_again = [*applies[:2], app("e1", "v1", 3.0)]
    assert not changelog.check(events, applied_again, REQ).held


def test_lost_duplicated_and_reordered_events_fail() -> None:
    events = [pub("e1", "v1", 0), pub("e2", "v2", 1)]
    lost = changelog.check(events, [app("e1", "v1", 1.0)], REQ)
    assert not lost.held
    assert "never processed e2" in (lost.detail or "")
    dup = changelog.check(
        events, [app("e1", "v1", 1.0), app("e2", "v2", 2.0), app("e2", "v2", 3.0)], REQ
    )
    assert not dup.held
    backwards = changelog.check(events, [app("e2", "v2", 1.0), app("e1", "v1", 2.0)], REQ)
    assert not backwards.held


def test_an_event_published_twice_is_in_order_at_its_first_offset() -> None:
    # An agent killed between publishing e1 and marking it sent publishes it again
    # (same event_id, offset 2) after e2: the region applied e1 from offset 0, then e2.
    events = [pub("e1", "v1", 0), pub("e2", "v2", 1), pub("e1", "v1", 2)]
    applies = [app("e1", "v1", 1.0), app("e2", "v2", 2.0), app("e1", "v1", 3.0, "superseded")]
    assert changelog.check(events, applies, REQ).held
    # Out of order whichever copy it came from: e2 (offset 1) applied after e3 (offset 3).
    events = [pub("e1", "v1", 0), pub("e2", "v2", 1), pub("e3", "v3", 3), pub("e1", "v1", 2)]
    backwards = [app("e1", "v1", 1.0), app("e3", "v3", 2.0), app("e2", "v4", 3.0)]
    verdict = changelog.check(events, backwards, REQ)
    assert not verdict.held
    assert "offset 1 after 3" in (verdict.detail or "")


# -- ownership around a fault --------------------------------------------------------------
def test_ownership_stable_and_progress() -> None:
    samples = [OwnerSample("ds", "eu-west", 5, 1.0), OwnerSample("ds", "eu-west", 5, 3.0)]
    assert ownership.stable(samples, 2.0, 4.0).held
    moved = [*samples, OwnerSample("ds", "eu-central", 9, 3.5)]
    assert not ownership.stable(moved, 2.0, 4.0).held
    assert ownership.stable(moved, 0.0, 0.5).held  # the move is outside the window

    b = Builder()
    b.write("k", "v1", t=0)
    b.write("k", "v2", t=100)
    assert ownership.resumed(b.ops(), fault_start_ns=50, heal_ns=80).held
    assert not ownership.resumed(b.ops(), fault_start_ns=50, heal_ns=200).held
    assert ownership.progress(b.ops(), [(90, 110)]).held
    assert not ownership.progress(b.ops(), [(20, 80)]).held


# -- records agree with etcd ---------------------------------------------------------------
def test_every_move_needs_a_journal_row() -> None:
    samples = [
        OwnerSample("ds", "eu-west", 5, 1.0),
        OwnerSample("ds", "eu-central", 9, 2.0),
        OwnerSample("ds", "eu-central", 9, 3.0),
    ]
    row = {"dataset": "ds", "from": "eu-west", "to": "eu-central", "epoch": 9}
    assert journal.journaled(samples, [row]).held
    missing = journal.journaled(samples, [])
    assert not missing.held
    assert "no failover journal row" in (missing.detail or "")


def test_controller_views_must_match_etcd() -> None:
    owners = {"a": "eu-west", "b": "eu-west", "c": "eu-central"}
    assert journal.views_agree({"eu-west": 2.0, "eu-central": 1.0, "us-east": 0.0}, owners).held
    assert not journal.views_agree({"eu-west": 3.0, "eu-central": 1.0}, owners).held
    assert not journal.views_agree({"eu-west": None}, owners).held


def test_accepts_are_read_from_an_agents_log() -> None:
    lines = [
        '{"event": "object_stored", "dataset": "ds", "key": "k", "epoch": 7, '
        '"timestamp": "2026-12-01T11:00:00.500000Z"}',
        '{"event": "object_stored", "dataset": "std", "key": "k", "epoch": null, '
        '"timestamp": "2026-12-01T11:00:01Z"}',
        "Task was destroyed but it is pending!",
        '{"event": "agent_serving", "timestamp": "2026-12-01T11:00:00Z"}',
    ]
    got = accepts_from_agent_log(lines, "eu-west", "a1", "log")
    assert [(a.dataset, a.epoch, a.region) for a in got] == [("ds", 7, "eu-west")]
    assert got[0].t % 1 == 0.5
    bad = ['{"event": "object_stored", "epoch": 3, "timestamp": "2026-12-01T11:00:00Z"}']
    with pytest.raises(ValueError, match="log line 1"):
        accepts_from_agent_log(bad, "eu-west", "a1", "log")
