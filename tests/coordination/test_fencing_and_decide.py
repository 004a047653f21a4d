"""Unit tests: FencedResource rules and the pure failover decisions (no I/O)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
from pathlib import Path

import pytest

from controlplane.coordination.orchestration.decide import plan_moves
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    DirectoryEpochs,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.ownership import Owner
from controlplane.coordination.protocols.view import ClusterView, RegionState
from controlplane.ports.coordination import KeyValue

from .helpers import REGIONS, critical

JURIS = {r.name: r.jurisdiction for r in REGIONS}


def test_fenced_resource_accepts_newest_and_rejects_older() -> None:
    res = FencedResource()
    res.admit("d", 10)
    res.admit("d", 10)
    res.admit("d", 12)
    with pytest.raises(StaleEpochError) as info:
        res.admit("d", 11)
    assert not info.value.retriable
    assert "epoch 11" in str(info.value) and "12" in str(info.value)
    assert res.highest_epoch("d") == 12
    res.admit("other", 1)  # per dataset


def test_handing_over_refuses_with_a_retriable_error_until_a_newer_epoch() -> None:
    res = FencedResource()
    res.observe("d", 5, handing_over=True)
    with pytest.raises(DatasetHandingOverError) as info:
        res.admit("d", 5)
    assert info.value.retriable
    res.admit("d", 9)  # the new owner's epoch goes through
    with pytest.raises(StaleEpochError):
        res.admit("d", 5)


def _admit_many(root: str, epoch: int, n: int) -> None:
    res = FencedResource(DirectoryEpochs(Path(root)))
    for _ in range(n):
        with contextlib.suppress(StaleEpochError):
            res.write("d", epoch, {}, f"w{epoch}")


def test_directory_records_are_replaced_whole(tmp_path: Path) -> None:
    """A record is rewritten only when it changes, by a new file renamed over it: a
    crash mid-update can never leave an empty record (read as epoch 0)."""
    res = FencedResource(DirectoryEpochs(tmp_path))
    res.observe("ckpt/a", 5)
    path = tmp_path / "ckpt%2Fa.epoch"
    first = path.stat().st_ino
    assert res.highest_epoch("ckpt/a") == 5
    assert path.stat().st_ino == first  # unchanged: not rewritten
    res.observe("ckpt/a", 8)
    assert path.stat().st_ino != first  # a new file, renamed into place
    assert json.loads(path.read_text())["epoch"] == 8
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".epoch", ".lock"]


def test_a_late_owner_event_does_not_lift_a_handover_freeze() -> None:
    """The owners and handover watches are separate streams: the owner event of the
    current epoch may arrive after the mark that froze it, and must not unfreeze."""
    res = FencedResource()
    res.observe("ds", 7, handing_over=True)  # the mark, seen first
    res.observe("ds", 7)  # the owner write of epoch 7, seen late
    with pytest.raises(DatasetHandingOverError):
        res.admit("ds", 7)
    res.observe("ds", 7, handing_over=False)  # the mark's removal, re-read from etcd
    assert res.admit("ds", 7) == 7
    res.observe("ds", 9)  # a newer owner: not frozen
    assert res.admit("ds", 9) == 9


@pytest.mark.parametrize("memory", ["memory", "directory"])
def test_news_older_than_what_the_fence_knows_is_ignored(tmp_path: Path, memory: str) -> None:
    """A read and the watch tell the fence in whichever order they end: the state it
    holds is that of the newest etcd revision it was told, never a late older one.
    (An epoch is the revision of its owner write: news at it is as of that at least.)"""
    res = FencedResource(DirectoryEpochs(tmp_path) if memory == "directory" else None)
    res.observe("ds", 90, handing_over=False, revision=100)
    res.observe("ds", 90, handing_over=True, revision=110)  # the watch: a mark at 110
    res.observe("ds", 90, handing_over=False, revision=105)  # a read begun before it, late
    with pytest.raises(DatasetHandingOverError):
        res.admit("ds", 90)
    res.observe("ds", 90, handing_over=True, revision=109)  # (older again: no change)
    res.observe("ds", 90, handing_over=False, revision=120)  # the mark's removal
    assert res.admit("ds", 90) == 90
    res.observe("ds", 90, handing_over=True, revision=115)  # a lagging read of the mark
    assert res.admit("ds", 90) == 90
    res.observe("ds", 90, revision=130)  # an owner event says nothing of marks
    res.observe("ds", 90, handing_over=True, revision=125)  # so this is still news
    with pytest.raises(DatasetHandingOverError):
        res.admit("ds", 90)
    # A write brings epoch 140 (its owner write's revision): a mark at it is news
    # whatever the fence learnt at 90, and an older read at 140 does not lift it.
    res.admit("ds", 140)
    res.observe("ds", 140, handing_over=True, revision=150)
    with pytest.raises(DatasetHandingOverError):
        res.admit("ds", 140)
    res.observe("ds", 140, handing_over=False, revision=145)
    with pytest.raises(DatasetHandingOverError):
        res.admit("ds", 140)
    # A newer epoch first seen by the watch (no revision told: as of its own).
    res.observe("ds", 160)
    res.observe("ds", 160, handing_over=True, revision=155)  # older than the epoch itself
    assert res.admit("ds", 160) == 160


def test_directory_epochs_are_atomic_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_admit_many, args=(str(tmp_path), e, 40)) for e in (3, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    log = DirectoryEpochs(tmp_path).read_log()
    assert len(log) == 80
    # Once epoch 7 was accepted, no write of epoch 3 was accepted after it.
    first7 = next(i for i, r in enumerate(log) if r["epoch"] == 7 and r["accepted"])
    assert not any(r["accepted"] for r in log[first7:] if r["epoch"] == 3)


def _view(
    alive: set[str], owners: dict[str, str], states: dict[str, RegionState] | None = None
) -> ClusterView:
    kvs = {r: KeyValue(f"/a/{r}", b"", 1, 1, 1) for r in alive}
    own = {d: Owner(d, r, 100 + i) for i, (d, r) in enumerate(sorted(owners.items()))}
    return ClusterView(200, kvs, states or {}, {}, False, own)


def test_plan_names_every_rejected_candidate_and_why() -> None:
    placements = [
        critical("a", order=("us-east", "eu-central", "eu-north")),
        critical("m", mode="manual"),
    ]
    view = _view(
        {"eu-north", "us-east"}, {"a": "eu-west", "m": "eu-west"}, {"eu-north": RegionState.ACTIVE}
    )
    plan = plan_moves(view, placements, JURIS, source="eu-west", automatic=True)
    assert [(m.dataset, m.to_region, m.epoch_before) for m in plan.moves] == [
        ("a", "eu-north", 100)
    ]
    reasons = {(r.dataset, r.region): r.reason for r in plan.rejected}
    assert reasons[("a", "us-east")].startswith("residency")
    assert reasons[("a", "eu-central")].startswith("dead")
    # Each of its candidates is named, as a region (the contract's `region` field).
    assert reasons[("m", "eu-central")].startswith("manual mode")
    assert reasons[("m", "eu-north")].startswith("manual mode")
    assert "*" not in {r.region for r in plan.rejected}
    assert plan.unmoved_names() == ["m"]


def test_plan_skips_draining_and_fenced_regions() -> None:
    placements = [critical("a", order=("eu-central", "eu-north"))]
    view = _view(
        {"eu-central", "eu-north"},
        {"a": "eu-west"},
        {"eu-central": RegionState.DRAINING, "eu-north": RegionState.FENCED},
    )
    plan = plan_moves(view, placements, JURIS, source="eu-west", automatic=True)
    assert plan.moves == [] and plan.unmoved_names() == ["a"]
    assert [r.reason.split(":")[0] for r in plan.rejected] == ["draining", "fenced"]


def test_operator_may_move_a_manual_dataset_by_naming_the_target() -> None:
    view = _view({"eu-central"}, {"m": "eu-west"})
    plan = plan_moves(
        view,
        [critical("m", mode="manual")],
        JURIS,
        source="eu-west",
        to="eu-central",
        automatic=False,
    )
    assert [m.to_region for m in plan.moves] == ["eu-central"]


def test_home_region_is_the_first_candidate_and_the_source_is_never_rejected() -> None:
    # ckpt/a was switched over to eu-central (its only failover.order entry); when
    # eu-central is lost, home eu-west takes it back.
    placements = [critical("a", order=("eu-central",))]
    view = _view({"eu-west", "eu-north"}, {"a": "eu-central"})
    plan = plan_moves(view, placements, JURIS, source="eu-central", automatic=True)
    assert [(m.dataset, m.from_region, m.to_region) for m in plan.moves] == [
        ("a", "eu-central", "eu-west")
    ]
    assert plan.rejected == [] and plan.unmoved == []
    # Home dead too: the dataset is reported, with every candidate but the source.
    view = _view({"eu-north"}, {"a": "eu-central"})
    plan = plan_moves(view, placements, JURIS, source="eu-central", automatic=True)
    assert [(r.region, r.reason.split(":")[0]) for r in plan.rejected] == [("eu-west", "dead")]
    [unmoved] = plan.unmoved
    assert unmoved.dataset == "a" and unmoved.reason == "no eligible candidate (eu-west: dead)"


def test_a_dataset_without_candidates_is_unmoved_and_one_without_placement_retired() -> None:
    # An owner record of a dataset no policy places as critical any more (retired, or
    # made standard) is nothing to move: it must not stop a drain or a failover.
    placements = [critical("a", order=())]
    view = _view({"eu-central"}, {"a": "eu-west", "gone": "eu-west"})
    plan = plan_moves(view, placements, JURIS, source="eu-west", automatic=False)
    assert [u.dataset for u in plan.unmoved] == ["a"]
    assert plan.unmoved[0].reason.startswith("no candidate region: its home eu-west is the")
    [retired] = plan.retired
    assert retired.dataset == "gone" and "nothing to move" in retired.reason
    assert plan.as_json()["retired"] == [{"dataset": "gone", "reason": retired.reason}]
    assert plan.rejected == [] and plan.moves == []
