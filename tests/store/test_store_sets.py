"""Version sets: visible only when every member is stored; `latest` is the newest
complete one; the members of the set readers see are never pruned under them."""

from __future__ import annotations

import pytest
from store_helpers import StoreFactory, remote

from agents.replication.answers import OUTCOMES
from agents.replication.replica_sets import _apply_all
from agents.store import ObjectStore
from agents.store.names import version_path
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Verdict, Version
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError


def test_local_set_needs_its_members_and_is_visible_at_once(store: ObjectStore) -> None:
    a = store.put("ckpt", "a", [b"a1"])
    b = store.put("ckpt", "b", [b"b1"])
    with pytest.raises(NotFoundError, match="names c at"):
        store.commit_set("ckpt", "step-1", {"a": a.hlc, "c": b.hlc})
    with pytest.raises(NotFoundError, match="no complete version set"):
        store.get_set("ckpt")
    record = store.commit_set("ckpt", "step-1", {"a": a.hlc, "b": b.hlc}, outbox=True)
    assert store.get_set("ckpt") == record
    assert store.get_set("ckpt", "step-1").members == {"a": a.hlc, "b": b.hlc}
    (event,) = store.outbox_pending()
    assert event.kind == "set" and event.set_id == "step-1" and event.members == record.members
    assert event.set_hlc == record.hlc
    assert [j.kind for j in store.journal_pending()][-1] == "set"


def test_bad_sets_are_refused(store: ObjectStore) -> None:
    a = store.put("ckpt", "a", [b"a1"])
    with pytest.raises(InvalidInputError, match="reserved"):
        store.commit_set("ckpt", "latest", {"a": a.hlc})
    with pytest.raises(InvalidInputError, match="no members"):
        store.commit_set("ckpt", "s", {})
    with pytest.raises(InvalidInputError, match=r"'\.\.' segment"):
        store.commit_set("ckpt", "s", {"../a": a.hlc})
    with pytest.raises(NotFoundError, match="not known"):
        store.get_set("ckpt", "nope")


def test_remote_set_waits_for_its_members_readers_see_the_previous(
    open_store: StoreFactory,
) -> None:
    store = open_store(keep_versions=1)
    a1, b1 = remote(b"a1", ago_ms=900), remote(b"b1", ago_ms=900, logical=1)
    store.apply("ckpt", "a", a1, [b"a1"])
    store.apply("ckpt", "b", b1, [b"b1"])
    first = HLC(system_ms() - 800, 0, "us-east")
    assert store.apply_set("ckpt", "step-1", first, {"a": a1.hlc, "b": b1.hlc}) is Verdict.APPLY
    assert store.get_set("ckpt").set_id == "step-1"

    a2, b2 = remote(b"a2", ago_ms=500), remote(b"b2", ago_ms=500, logical=1)
    second = HLC(system_ms() - 400, 0, "us-east")
    store.apply_set("ckpt", "step-2", second, {"a": a2.hlc, "b": b2.hlc})  # before its members
    store.apply("ckpt", "a", a2, [b"a2"])
    # keep_versions=1, but a1 is a member of the set readers see: kept
    assert store.get_set("ckpt").set_id == "step-1"
    assert store.read_bytes("ckpt", "a", a1.hlc) == b"a1"
    with pytest.raises(UnavailableError, match="1 of its 2 members"):
        store.get_set("ckpt", "step-2")

    store.apply("ckpt", "b", b2, [b"b2"])
    latest = store.get_set("ckpt")
    assert latest.set_id == "step-2" and latest.members == {"a": a2.hlc, "b": b2.hlc}
    # step-1 no longer pins its members: they went with the set that replaced it
    assert [s.version for s in store.versions("ckpt", "a")] == [a2]
    assert [s.version for s in store.versions("ckpt", "b")] == [b2]
    # and step-1 itself, incomplete for good behind a complete newer set, is forgotten
    assert [(s.set_id, s.complete) for s in store.list_sets("ckpt")] == [("step-2", True)]
    with pytest.raises(NotFoundError, match="step-1 of ckpt is not known"):
        store.get_set("ckpt", "step-1")
    removed = [j for j in store.journal_pending() if j.kind == "set_removed"]
    assert [(j.data["set"], j.hlc) for j in removed] == [("step-1", first.text)]
    # A replay of it is superseded, not recorded again: nothing would ever show it
    assert store.apply_set("ckpt", "step-1", first, {"a": a1.hlc, "b": b1.hlc}) is Verdict.OLDER
    assert [s.set_id for s in store.list_sets("ckpt")] == ["step-2"]


def test_apply_set_is_last_writer_wins_per_set_id(store: ObjectStore) -> None:
    a = remote(b"a", ago_ms=900)
    store.apply("ckpt", "a", a, [b"a"])
    older, newer = HLC(system_ms() - 700, 0, "us-east"), HLC(system_ms() - 600, 0, "us-east")
    assert store.apply_set("ckpt", "s", newer, {"a": a.hlc}) is Verdict.APPLY
    assert store.apply_set("ckpt", "s", older, {"a": a.hlc}) is Verdict.OLDER
    assert store.apply_set("ckpt", "s", newer, {"a": a.hlc}) is Verdict.SAME
    b = store.put("ckpt", "b", [b"b"])
    assert store.apply_set("ckpt", "s", newer, {"b": b.hlc}) is Verdict.COLLISION
    assert store.get_set("ckpt", "s").members == {"a": a.hlc}


def test_a_set_of_newest_members_survives_many_writes(open_store: StoreFactory) -> None:
    store = open_store(keep_versions=1)
    v = store.put("ckpt", "a", [b"pinned"])
    store.commit_set("ckpt", "s", {"a": v.hlc})
    for i in range(3):
        store.put("ckpt", "a", [f"later {i}".encode()])
    assert store.read_bytes("ckpt", "a", v.hlc) == b"pinned"
    assert len(store.versions("ckpt", "a")) == 2  # the newest and the pinned one


def test_read_a_member_through_its_set(store: ObjectStore) -> None:
    a1 = store.put("ckpt", "a", [b"a1"])
    record = store.commit_set("ckpt", "step-1", {"a": a1.hlc})
    store.put("ckpt", "a", [b"a2"])
    with store.open("ckpt", "a", set_id="latest") as reader:
        assert reader.read_all() == b"a1" and reader.version == a1
    assert store.read_bytes("ckpt", "a") == b"a2"
    with pytest.raises(NotFoundError, match="no member b"):
        store.open("ckpt", "b", set_id="step-1")
    domain = record.as_version_set()
    assert (domain.id, domain.hlc, domain.member("a")) == ("step-1", record.hlc, domain.members[0])
    assert domain.members[0].version == a1.hlc
    gone = store.delete("ckpt", "a", set_id="step-2")
    assert store.stat("ckpt", "a", include_deleted=True).set_id == "step-2" and gone.is_tombstone


def test_a_store_holds_sets_from_its_first_member_on(store: ObjectStore) -> None:
    # A member is stored before its set is committed: the agent already holds the
    # region's only copy of it (the roster entry must not vouch for more).
    assert not store.holds_sets()
    store.put("plain", "k", [b"no set"])
    assert not store.holds_sets()
    a = store.put("ckpt", "a", [b"A"], set_id="s1")
    assert store.holds_sets()
    store.commit_set("ckpt", "s1", {"a": a.hlc})
    assert store.holds_sets()


def test_sets_do_not_pile_up_one_per_checkpoint(open_store: StoreFactory) -> None:
    # Each step writes a new version of every shard and commits them as a set. With
    # two versions kept, the newest set and the one before are whole (readable by
    # name); an older one lost a member to pruning and is gone, not left behind.
    store = open_store(keep_versions=2)
    for step in range(1, 9):
        members = {k: store.put("ckpt", k, [f"{k}{step}".encode()]).hlc for k in "abc"}
        store.commit_set("ckpt", f"step-{step}", members)
        kept = [s.set_id for s in store.list_sets("ckpt")]
        assert kept == [f"step-{n}" for n in range(step, max(0, step - 2), -1)]
    assert store.get_set("ckpt", "step-7").complete
    with store.open("ckpt", "b", set_id="step-7") as reader:
        assert reader.read_all() == b"b7"
    with pytest.raises(NotFoundError, match="step-6 of ckpt is not known"):
        store.get_set("ckpt", "step-6")
    assert store.holds_sets()


def test_an_older_set_whose_members_are_all_here_is_recorded(store: ObjectStore) -> None:
    # Late, but whole: readable by name, while `latest` stays the newer set.
    a1, b1 = remote(b"a1", ago_ms=900), remote(b"b1", ago_ms=900, logical=1)
    store.apply("ckpt", "a", a1, [b"a1"])
    store.apply("ckpt", "b", b1, [b"b1"])
    newer = HLC(system_ms() - 500, 0, "us-east")
    assert store.apply_set("ckpt", "new", newer, {"b": b1.hlc}) is Verdict.APPLY
    older = HLC(system_ms() - 800, 0, "us-east")
    assert store.apply_set("ckpt", "old", older, {"a": a1.hlc}) is Verdict.APPLY
    assert store.get_set("ckpt", "old").members == {"a": a1.hlc}
    assert store.get_set("ckpt").set_id == "new"


def test_an_older_set_whose_members_are_on_their_way_is_kept(store: ObjectStore) -> None:
    # Its member is a key no newer version keeps out: it can still arrive (a change log
    # delivers sets and members in any order), so a newer set completing first leaves
    # it recorded, and it shows by name once the member is here.
    x1, y2 = remote(b"x1", ago_ms=900), remote(b"y2", ago_ms=600)
    first, second = HLC(system_ms() - 800, 0, "us-east"), HLC(system_ms() - 500, 0, "us-east")
    assert store.apply_set("ckpt", "step-1", first, {"x": x1.hlc}) is Verdict.APPLY
    store.apply("ckpt", "y", y2, [b"y2"])
    assert store.apply_set("ckpt", "step-2", second, {"y": y2.hlc}) is Verdict.APPLY
    assert [s.set_id for s in store.list_sets("ckpt")] == ["step-2", "step-1"]
    store.apply("ckpt", "x", x1, [b"x1"])
    assert store.get_set("ckpt", "step-1").members == {"x": x1.hlc}
    assert store.get_set("ckpt").set_id == "step-2"


def test_an_older_set_with_a_member_marked_missing_is_kept(open_store: StoreFactory) -> None:
    # A repair marks lost bytes missing and a re-sync may restore them: the set whose
    # member they are can be whole again, so a newer set does not make it go.
    store = open_store(keep_versions=2)
    a1, b1 = store.put("ckpt", "a", [b"a1"]), store.put("ckpt", "b", [b"b1"])
    store.commit_set("ckpt", "step-1", {"a": a1.hlc, "b": b1.hlc})
    a2, b2 = store.put("ckpt", "a", [b"a2"]), store.put("ckpt", "b", [b"b2"])
    store.commit_set("ckpt", "step-2", {"a": a2.hlc, "b": b2.hlc})
    root, clock = store.root, store.clock
    store.close()
    (root / version_path("ckpt", "a", a1.hlc)).unlink()
    store = open_store(root, keep_versions=2, clock=clock)  # repair: a1 missing
    c3 = store.put("ckpt", "c", [b"c3"])
    store.commit_set("ckpt", "step-3", {"c": c3.hlc})
    assert [(s.set_id, s.complete) for s in store.list_sets("ckpt")] == [
        ("step-3", True),
        ("step-2", True),
        ("step-1", False),
    ]


def test_a_forgotten_set_still_wins_over_an_older_definition_of_its_id(
    open_store: StoreFactory,
) -> None:
    store = open_store(keep_versions=1)
    a1, a2 = remote(b"a1", ago_ms=900), remote(b"a2", ago_ms=700)
    older, x_at = HLC(system_ms() - 850, 0, "us-east"), HLC(system_ms() - 800, 0, "us-east")
    store.apply("ckpt", "a", a1, [b"a1"])
    assert store.apply_set("ckpt", "x", x_at, {"a": a1.hlc}) is Verdict.APPLY
    store.apply("ckpt", "a", a2, [b"a2"])
    store.apply_set("ckpt", "y", HLC(system_ms() - 600, 0, "us-east"), {"a": a2.hlc})
    assert [s.set_id for s in store.list_sets("ckpt")] == ["y"]  # x lost a1 to pruning
    # A late definition of x older than the one forgotten, whose member is here: it
    # would show as x, stale, were the forgotten one not remembered.
    assert store.apply_set("ckpt", "x", older, {"a": a2.hlc}) is Verdict.OLDER
    with pytest.raises(NotFoundError, match="x of ckpt is not known"):
        store.get_set("ckpt", "x")
    # The mark is kept as long as a tombstone (a late definition past that is taken)
    store.expire_tombstones(now_ms=x_at.wall_ms + 1000 * store.tombstone_retention_s - 1)
    assert store.apply_set("ckpt", "x", older, {"a": a2.hlc}) is Verdict.OLDER
    past = x_at.wall_ms + 1000 * store.tombstone_retention_s + 1
    store.expire_tombstones(now_ms=past, datasets=lambda dataset: dataset != "ckpt")
    assert store.apply_set("ckpt", "x", older, {"a": a2.hlc}) is Verdict.OLDER  # not its
    store.expire_tombstones(now_ms=past)
    assert store.apply_set("ckpt", "x", older, {"a": a2.hlc}) is Verdict.APPLY


def test_a_replica_answers_superseded_for_a_set_forgotten_as_it_was_applied(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ReplicateSet applies a set, then asks what it lacks in another transaction; a
    # newer set completing in between makes it go. The push is answered "superseded",
    # not failed whole with a non-retriable "not known" (every set of the call lost).
    store = open_store(keep_versions=1)
    a1, a2 = remote(b"a1", ago_ms=900), remote(b"a2", ago_ms=700)
    x_at, y_at = HLC(system_ms() - 800, 0, "us-east"), HLC(system_ms() - 600, 0, "us-east")
    real = store.missing_members

    def newer_completes_first(dataset: str, set_id: str) -> list[str]:
        store.apply("ckpt", "a", a2, [b"a2"])
        store.apply_set("ckpt", "y", y_at, {"a": a2.hlc})
        return real(dataset, set_id)

    monkeypatch.setattr(store, "missing_members", newer_completes_first)
    x = VersionSet("ckpt", "x", (SetMember("a", a1.hlc),), x_at)
    (answer,) = _apply_all(store, [x])
    assert (answer.id, answer.outcome, answer.complete) == ("x", OUTCOMES[Verdict.OLDER], False)
    assert [s.set_id for s in store.list_sets("ckpt")] == ["y"]


def test_a_forgotten_set_is_taken_again_once_its_member_can_be_stored(
    store: ObjectStore,
) -> None:
    # What kept its member out can go (here a tombstone's expiry; a rewind or hand-off
    # too): the same definition, pushed again, is judged afresh and recorded whole.
    a1, b2 = remote(b"a1", ago_ms=9_000), remote(b"b2", ago_ms=8_000)
    s1, s2 = HLC(system_ms() - 8_500, 0, "us-east"), HLC(system_ms() - 7_500, 0, "us-east")
    assert store.apply_set("ckpt", "s1", s1, {"a": a1.hlc}) is Verdict.APPLY
    store.apply("ckpt", "a", Version.delete(HLC(system_ms() - 8_200, 0, "us-east")), None)
    store.apply("ckpt", "b", b2, [b"b2"])
    store.apply_set("ckpt", "s2", s2, {"b": b2.hlc})
    assert [s.set_id for s in store.list_sets("ckpt")] == ["s2"]  # a1 kept out: s1 went
    assert store.apply_set("ckpt", "s1", s1, {"a": a1.hlc}) is Verdict.OLDER  # still so
    assert store.expire_tombstones(now_ms=system_ms() + 10**12) == 1
    assert store.apply("ckpt", "a", a1, [b"a1"]).verdict is Verdict.APPLY
    assert store.apply_set("ckpt", "s1", s1, {"a": a1.hlc}) is Verdict.APPLY
    assert store.get_set("ckpt", "s1").members == {"a": a1.hlc}


def test_a_rebalance_never_hands_off_a_set_member_under_a_plain_overwrite(
    store: ObjectStore,
) -> None:
    # The newest version of `a` is a plain put, but the set readers see names the one
    # before: handing the object to other agents would take that member along.
    a1 = store.put("ckpt", "a", [b"a1"])  # stored without its set id (an older agent)
    store.commit_set("ckpt", "step-1", {"a": a1.hlc})
    plain = store.put("ckpt", "a", [b"a2"])
    assert not store.hand_off("ckpt", "a", plain.hlc)
    with store.open("ckpt", "a", set_id="latest") as reader:
        assert reader.read_all() == b"a1"
    # A member written in a set not committed yet stays too
    store.put("ckpt", "b", [b"b1"], set_id="step-2")
    assert not store.hand_off("ckpt", "b", store.put("ckpt", "b", [b"b2"]).hlc)
    # Named by no set and written in none: it goes
    other = store.put("plain", "k", [b"k"])
    assert store.hand_off("plain", "k", other.hlc)


def test_a_deleted_member_of_the_set_readers_see_outlives_its_tombstone(
    store: ObjectStore,
) -> None:
    # The set still shows (a delete after it does not change it): forgetting the key
    # with its tombstone would take the member the set names, and the set with it.
    a1 = store.put("ckpt", "a", [b"a1"])
    store.commit_set("ckpt", "step-1", {"a": a1.hlc})
    tomb = store.delete("ckpt", "a")
    later = tomb.hlc.wall_ms + 1000 * store.tombstone_retention_s + 1
    assert store.expire_tombstones(now_ms=later) == 0
    with store.open("ckpt", "a", set_id="latest") as reader:
        assert reader.read_all() == b"a1"


def test_the_rebalance_sees_an_object_a_set_holds_whatever_its_newest_version(
    store: ObjectStore,
) -> None:
    a1 = store.put("ckpt", "a", [b"a1"])
    store.commit_set("ckpt", "step-1", {"a": a1.hlc})
    store.put("ckpt", "a", [b"a2"])  # plain: the set names the one before
    store.put("ckpt", "b", [b"b1"], set_id="step-2")
    store.put("ckpt", "b", [b"b2"])
    store.put("ckpt", "c", [b"c"])
    assert {s.key: s.set_id for s in store.held()} == {"a": "step-1", "b": "step-2", "c": None}


def test_deleting_an_old_checkpoint_frees_it_once_its_tombstones_expire(
    store: ObjectStore,
) -> None:
    # A key per checkpoint: the old one's set stays whole (readable by name) until its
    # deleted keys expire; then they go, and the set with them, not its bytes for good.
    one = store.put("ckpt", "c1/a", [b"one"])
    store.commit_set("ckpt", "step-1", {"c1/a": one.hlc})
    two = store.put("ckpt", "c2/a", [b"two"])
    store.commit_set("ckpt", "step-2", {"c2/a": two.hlc})
    tomb = store.delete("ckpt", "c1/a")
    later = tomb.hlc.wall_ms + 1000 * store.tombstone_retention_s + 1
    assert store.expire_tombstones(now_ms=later) == 1
    assert store.versions("ckpt", "c1/a") == []
    assert [s.set_id for s in store.list_sets("ckpt")] == ["step-2"]
    removed = [j.data for j in store.journal_pending() if j.kind == "set_removed"]
    assert removed == [{"set": "step-1", "reason": "member expired"}]
    with store.open("ckpt", "c2/a", set_id="latest") as reader:
        assert reader.read_all() == b"two"


def test_a_member_older_than_its_key_s_newest_is_stored_while_its_set_needs_it(
    open_store: StoreFactory,
) -> None:
    """A replica cut off while set step-1 was written gets the next checkpoint's version
    of a member first: by LWW alone the older member is never stored, step-1 never
    completes and the owner's catch-up never ends. A recorded, incomplete set naming
    exactly that version takes it as an older row; the newest stays the key's head."""
    store = open_store(keep_versions=1)
    a1, b1 = remote(b"a1", ago_ms=900), remote(b"b1", ago_ms=900, logical=1)
    a2 = remote(b"a2", ago_ms=500)
    store.apply("ckpt", "b", b1, [b"b1"])
    store.apply("ckpt", "a", a2, [b"a2"])  # the next checkpoint's, arrived first
    first = HLC(system_ms() - 800, 0, "us-east")
    store.apply_set("ckpt", "step-1", first, {"a": a1.hlc, "b": b1.hlc})
    # Pushed without its set, or for a set that does not name it: LWW says older.
    assert store.apply("ckpt", "a", a1, [b"a1"]).verdict is Verdict.OLDER
    assert store.apply("ckpt", "a", a1, [b"a1"], set_id="other").verdict is Verdict.OLDER
    with pytest.raises(NotFoundError):
        store.stat("ckpt", "a", a1.hlc)
    got = store.apply("ckpt", "a", a1, [b"a1"], set_id="step-1")
    assert got.verdict is Verdict.APPLY and got.newest == a2  # answered with the head
    assert store.head("ckpt", "a") == a2
    assert store.read_bytes("ckpt", "a", a1.hlc) == b"a1"  # kept under keep_versions=1
    assert store.get_set("ckpt").set_id == "step-1"  # complete now, so shown


def test_a_superseded_set_takes_no_older_member(open_store: StoreFactory) -> None:
    """Behind a newer complete set, an incomplete older one is never shown: it keeps
    no older version of a key out of LWW's hands."""
    store = open_store(keep_versions=1)
    a1, a2 = remote(b"a1", ago_ms=900), remote(b"a2", ago_ms=500)
    store.apply("ckpt", "a", a2, [b"a2"])
    first, second = HLC(system_ms() - 800, 0, "us-east"), HLC(system_ms() - 400, 0, "us-east")
    store.apply_set("ckpt", "step-1", first, {"a": a1.hlc})
    store.apply_set("ckpt", "step-2", second, {"a": a2.hlc})  # complete at once
    assert store.apply("ckpt", "a", a1, [b"a1"], set_id="step-1").verdict is Verdict.OLDER
    with pytest.raises(NotFoundError):
        store.stat("ckpt", "a", a1.hlc)


def test_a_set_too_large_for_its_change_event_is_refused_at_commit(store: ObjectStore) -> None:
    # Acked, it would be set aside by the outbox and reach no other region.
    members = {f"shard-{i:06}": HLC(1_000 + i, 0, "eu-west") for i in range(30_000)}
    with pytest.raises(InvalidInputError, match="over the change log's"):
        store.commit_set("ds", "huge", members, outbox=True)
    assert store.outbox_count() == 0
