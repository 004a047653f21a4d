"""The checkers scenarios 5, 8, 10 and 13 and the critical workload added, on
hand-made histories: each must fail on a violation and pass otherwise."""

from __future__ import annotations

from chaos.checkers import clock_skew, critical, lost_writes, residency
from chaos.checkers.verdict import Verdict
from chaos.records import AcceptRecord, ApplyRecord, ObjectState, OwnerSample

from .hist import Builder

REQ = {"ds": ["eu-west", "eu-central"]}
BOTH = ("eu-west", "eu-central")


def held(version: str, digest: str, regions: tuple[str, ...] = BOTH) -> list[ObjectState]:
    return [ObjectState(r, "ds", "k", version, digest) for r in regions]


# -- lost writes: info writes named by their digest, narrowed regions ---------------------
def test_a_version_made_by_an_info_write_without_a_reply_supersedes() -> None:
    b = Builder()
    b.write("k", "v1")
    b.op("write", "ds", "k", "info", sent={"digest": "d-late"})  # the reply was lost
    assert lost_writes.check(b.ops(), held("v2", "d-late"), REQ).held
    # ... but a newer version with content nobody wrote loses the acked one
    assert not lost_writes.check(b.ops(), held("v2", "d-other"), REQ).held


def test_only_in_narrows_where_a_write_must_be() -> None:
    b = Builder()
    b.write("k", "v1", op_id="skewed", region="eu-central")
    final = held("v1", "d-v1", ("eu-central",))
    assert not lost_writes.check(b.ops(), final, REQ).held
    narrowed = lost_writes.check(b.ops(), final, REQ, only_in=lambda op: ["eu-central"])
    assert narrowed.held


# -- critical: no acked critical write lost, one owner per epoch --------------------------
def test_an_acked_critical_write_missing_in_a_replica_is_lost() -> None:
    b = Builder()
    b.write("k", "v1")
    verdict = critical.lost(b.ops(), held("v1", "d-v1", ("eu-west",)), REQ)
    assert not verdict.held
    assert verdict.name == critical.LOST
    assert "absent in eu-central" in (verdict.detail or "")
    assert critical.lost(b.ops(), held("v1", "d-v1"), REQ).held


def test_critical_lost_judges_only_the_critical_datasets() -> None:
    b = Builder()
    b.op("write", "std", "k", "ok", sent={"digest": "x"}, seen={"version": "v1"})
    assert critical.lost(b.ops(), [], REQ).held


def acc(region: str, epoch: int, t: float, ds: str = "ds", ok: bool = True) -> AcceptRecord:
    return AcceptRecord(ds, epoch, region, f"{region}-agent", ok, t)


def test_one_owner_per_epoch_holds_across_a_failover() -> None:
    log = [acc("eu-west", 3, 1.0), acc("eu-west", 3, 2.0), acc("eu-central", 4, 3.0)]
    log.append(acc("eu-west", 3, 3.5, ok=False))  # the deposed owner refused: fine
    assert critical.one_owner(log, ["ds"]).held


def test_two_regions_accepting_one_epoch_is_a_violation() -> None:
    log = [acc("eu-west", 3, 1.0), acc("eu-central", 3, 9.0)]
    verdict = critical.one_owner(log, ["ds"])
    assert not verdict.held
    assert "epoch 3 accepted by eu-central" in (verdict.detail or "")
    assert critical.one_owner(log, ["other"]).held  # other datasets are not judged


def test_a_region_going_back_to_an_older_epoch_is_a_violation() -> None:
    log = [acc("eu-west", 5, 1.0), acc("eu-west", 3, 2.0)]
    assert not critical.one_owner(log, ["ds"]).held


# -- residency of owners ------------------------------------------------------------------
RES = {"ds": {"EU"}}
JUR = {"eu-west": "EU", "eu-central": "EU", "us-east": "US"}


def test_owners_within_residency_hold() -> None:
    samples = [OwnerSample("ds", "eu-west", 1, 0.0), OwnerSample("ds", "eu-central", 2, 1.0)]
    assert residency.owners(samples, RES, JUR).held


def test_a_failover_to_a_region_outside_residency_is_a_violation() -> None:
    samples = [OwnerSample("ds", "eu-west", 1, 0.0), OwnerSample("ds", "us-east", 2, 1.0)]
    verdict = residency.owners(samples, RES, JUR)
    assert not verdict.held
    assert "owned by us-east (US) at epoch 2" in (verdict.detail or "")


# -- clock skew ---------------------------------------------------------------------------
def rec(outcome: str, wall_ms: int, t: float) -> ApplyRecord:
    version = f"{wall_ms:013d}.00000@eu-north"
    return ApplyRecord("eu-west", "e1", "ds", "k", version, outcome, t)  # type: ignore[arg-type]


def test_skewed_versions_quarantined_hold() -> None:
    applies = [rec("refused", 1_000_030_000, 1_000_000.0), rec("applied", 1_000_000_500, 1e6)]
    assert clock_skew.check(applies, 1000).held


def test_a_skewed_version_applied_is_a_violation() -> None:
    applies = [rec("refused", 1_000_030_000, 1e6), rec("applied", 1_000_002_000, 1e6)]
    verdict = clock_skew.check(applies, 1000)
    assert not verdict.held
    assert "2000 ms ahead" in (verdict.detail or "")


def test_no_quarantine_at_all_means_the_skew_did_not_bite() -> None:
    assert not clock_skew.check([rec("applied", 1_000_000_000, 1e6)], 1000).held
    assert clock_skew.check([], 1000, expect_quarantine=False).held


def test_a_critical_write_kept_by_a_quorum_and_the_owner_is_not_lost() -> None:
    b = Builder()
    b.write("k", "v1")
    three = {"ds": ["eu-west", "eu-central", "eu-north"]}
    two_copies = held("v1", "d-v1", ("eu-west", "eu-central"))
    assert critical.lost(b.ops(), two_copies, three, {"ds": "eu-central"}, quorum=2).held
    verdict = critical.lost(b.ops(), two_copies, three, {"ds": "eu-north"}, quorum=2)
    assert not verdict.held and "lost by the owner at the end" in (verdict.detail or "")
    one_copy = held("v1", "d-v1", ("eu-west",))
    verdict = critical.lost(b.ops(), one_copy, three, {"ds": "eu-west"}, quorum=2)
    assert not verdict.held and "kept by 1 of 3 holders" in (verdict.detail or "")


def test_a_verdict_that_judged_nothing_fails() -> None:
    from chaos.runner import _judged_something

    held = Verdict.of("no-acked-critical-write-lost", [], "0 acked critical writes all kept")
    failed = _judged_something(held, 0, "the critical workload acked no write")
    assert not failed.held
    assert failed.detail == "nothing to judge: the critical workload acked no write"
    assert _judged_something(held, 3, "unused") is held
    broken = Verdict.of("no-acked-critical-write-lost", ["w1 lost"])
    assert _judged_something(broken, 0, "unused") is broken  # its own problems stand


async def test_a_client_cut_from_etcd_writes_with_the_epoch_it_last_read() -> None:
    """So that a deposed owner's clients do reach its agent (and the fence), which must
    refuse them: the harness must not be what keeps them from writing."""
    from fakes.coordination import MemoryCoordination

    from chaos.workload import RegionClients
    from controlplane.coordination.protocols.ownership import Ownership

    coord = MemoryCoordination()
    own = Ownership(coord)
    epoch = await own.claim("ckpt/a", "eu-west", expect_epoch=0, reason="t", actor="t")
    west, central = RegionClients("eu-west", []), RegionClients("eu-central", [])
    for rc in (west, central):
        rc.ownership = lambda: _async(own)  # type: ignore[method-assign]
    first = await west.owner_here("ckpt/a", 1)
    assert not isinstance(first, str) and first.epoch == epoch
    assert await central.owner_here("ckpt/a", 1) == "not the owner (owner: eu-west)"
    coord.set_unavailable(True)
    cut = await west.owner_here("ckpt/a", 1)
    assert not isinstance(cut, str) and cut.epoch == epoch  # writes on, with epoch it knew
    never = await central.owner_here("ckpt/a", 1)
    assert isinstance(never, str) and never.startswith("owner unknown")
    await coord.close()


async def _async(value: object) -> object:
    return value
