"""A move's journal row counts only versions as its RPO exposure: a probe that could not
compare the agents says so in the row instead of counting as one missing version."""

from __future__ import annotations

from controlplane.coordination.catalog_glue.sources import JournalEntry
from controlplane.coordination.orchestration.decide import Move
from controlplane.coordination.orchestration.journal import moved_entry
from controlplane.coordination.timeutil import utcnow

MOVE = Move("ckpt/a", "eu-west", "eu-central", 4)


def _row(incomplete: list[str] | None) -> JournalEntry:
    now = utcnow()
    return moved_entry(
        MOVE,
        9,
        kind="automatic",
        reason="lease expired",
        actor="t",
        started_at=now,
        completed_at=now,
        incomplete=incomplete,
    )


def test_versions_the_new_owner_lacks_are_its_rpo_exposure() -> None:
    row = _row(["m1@1796000000123.00007@eu-west", "(x)@1796000000124.00000@eu-west"])
    assert row.rpo_versions == 2
    assert "rpo_versions_unknown" not in row.details


def test_a_probe_that_could_not_compare_marks_the_rpo_unknown() -> None:
    row = _row(["(agents of ckpt/a cannot be compared: etcd is unreachable (errno 111))"])
    assert row.rpo_versions == 0
    assert row.details["rpo_versions_unknown"] is True
    assert row.details["rpo_error"] == (
        "agents of ckpt/a cannot be compared: etcd is unreachable (errno 111)"
    )
    assert row.details["incomplete_versions"] == []


def test_an_unmeasured_move_says_nothing_of_versions() -> None:
    row = _row(None)
    assert row.rpo_versions == 0 and "incomplete_versions" not in row.details
