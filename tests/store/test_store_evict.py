"""`ObjectStore.evict`: the copies of a dataset a region no longer places go, each object
whole (every version, its files, the sets naming it), journalled `removed` so the
catalog forgets them; an object written here since the version proven elsewhere stays."""

from __future__ import annotations

import pytest

from agents.store import ObjectStore
from controlplane.domain.errors import ClockSkewError
from controlplane.domain.hlc import HLC
from controlplane.errors import InvalidInputError, MeridianError, NotFoundError


def test_evict_forgets_whole_objects_and_keeps_newer_writes(store: ObjectStore) -> None:
    a1 = store.put("ckpt", "a", [b"a, first"])
    a2 = store.put("ckpt", "a", [b"a, second"])
    b = store.put("ckpt", "b", [b"b"])
    store.put("ckpt", "gone", [b"deleted"])
    gone = store.delete("ckpt", "gone")  # a tombstone is a copy too
    c1 = store.put("ckpt", "c", [b"c, proven elsewhere"])
    store.put("ckpt", "c", [b"c, written here since"])
    other = store.put("logs", "a", [b"another dataset"])
    record = store.commit_set("ckpt", "step-1", {"a": a2.hlc, "b": b.hlc})
    held = {k: store.versions("ckpt", k) for k in ("a", "b", "gone")}
    every = {k: list(v) for k, v in held.items()}
    files = {p for p in (store.root / "objects").rglob("*") if p.is_file()}
    start = store.journal_position()

    asked = [
        ("a", a2.hlc),  # the newest: goes with the older version
        ("b", HLC(b.hlc.wall_ms + 5, 0, "eu-west")),  # proven newer elsewhere: goes
        ("gone", gone.hlc),
        ("c", c1.hlc),  # written here since: kept
        ("never", a1.hlc),  # not held: skipped
    ]
    # A set readers may see here names a and b: they stay unless it was proven elsewhere.
    first = store.evict("ckpt", asked)
    assert first.objects == 1 and dict(first.kept).keys() == {"a", "b", "c"}
    assert "version set step-1" in dict(first.kept)["a"]
    assert "written here since" in dict(first.kept)["c"]
    assert store.versions("ckpt", "gone") == []
    held["gone"] = []
    # Proven by id alone, or another record of the id: not this one.
    wrong = store.evict("ckpt", asked, proven_sets={("step-1", str(HLC(1, 0, "eu-west")))})
    assert wrong.objects == 0 and dict(wrong.kept).keys() == {"a", "b", "c"}
    done = store.evict("ckpt", asked, proven_sets={("step-1", str(record.hlc))})

    assert (done.objects, [k for k, _ in done.kept]) == (2, ["c"])
    assert done.versions == sum(map(len, held.values()))
    assert done.bytes == sum(s.version.size for v in held.values() for s in v)
    for key in ("a", "b", "gone"):
        assert store.versions("ckpt", key) == []
    assert len(store.versions("ckpt", "c")) == 2
    assert store.versions("logs", "a")[0].version == other
    puts = sum(not s.version.is_tombstone for v in every.values() for s in v)
    left = {p for p in (store.root / "objects").rglob("*") if p.is_file()}
    assert left < files and len(files - left) == puts  # their files went with them
    with pytest.raises(NotFoundError):
        store.get_set("ckpt", "step-1")
    removed = [e for e in store.journal_pending(10_000) if e.seq > start and e.kind == "removed"]
    assert sorted((e.key, e.hlc, e.data["reason"]) for e in removed) == sorted(
        (k, s.version.hlc.text, "evicted") for k, v in every.items() for s in v
    )
    assert [e.data["set"] for e in store.journal_pending(10_000) if e.kind == "set_removed"] == [
        "step-1"
    ]


def test_evict_refuses_a_bad_name_before_touching_anything(store: ObjectStore) -> None:
    v = store.put("ckpt", "a", [b"a"])
    with pytest.raises(InvalidInputError):
        store.evict("ckpt", [("a", v.hlc), ("../escape", v.hlc)])
    with pytest.raises(InvalidInputError):
        store.evict("../ckpt", [("a", v.hlc)])
    assert [s.version for s in store.versions("ckpt", "a")] == [v]


def test_evict_keeps_an_object_whose_change_event_is_not_yet_published(
    store: ObjectStore,
) -> None:
    """The outbox would publish an event naming a version nobody could send."""
    v = store.put("logs", "a", [b"written here"], outbox=True, policy_revision=1)
    done = store.evict("logs", [("a", v.hlc)])
    assert done.objects == 0 and "not yet published" in dict(done.kept)["a"]
    assert [s.version for s in store.versions("logs", "a")] == [v]


def test_evict_judges_sets_against_the_regions_newest_proven_set(store: ObjectStore) -> None:
    """In a region of several agents a set stays on the agent that took it: this agent's
    own newest complete set is older than the region's, which readers see. Proven, that
    newer set is the floor; and a set held incomplete here is shown to nobody."""
    a = store.put("ckpt", "a", [b"a"])
    b = store.put("ckpt", "b", [b"b"])
    own = store.commit_set("ckpt", "step-1", {"a": a.hlc, "b": b.hlc})
    asked = [("a", a.hlc), ("b", b.hlc)]
    # Nothing proven: step-1 is the newest complete set here and readers may see it.
    assert dict(store.evict("ckpt", asked).kept).keys() == {"a", "b"}
    # A newer set, taken by another agent, proven elsewhere: step-1 pins nothing now...
    region_newest = HLC(own.hlc.wall_ms + 10, 0, "eu-west")
    # ...nor does a newer set that names b and is incomplete here (c never came).
    pending = HLC(own.hlc.wall_ms + 20, 0, "eu-central")
    store.apply_set("ckpt", "step-3", pending, {"b": b.hlc, "c": pending})
    with pytest.raises(MeridianError):
        store.get_set("ckpt", "step-3")  # incomplete: readers are not shown it
    done = store.evict("ckpt", asked, proven_sets={("step-2", str(region_newest))})
    assert (done.objects, done.kept) == (2, ())
    for key in ("a", "b"):
        assert store.versions("ckpt", key) == []
    # A complete set of this agent newer than the proven one still pins what it names.
    c = store.put("ckpt", "c", [b"c"])
    store.commit_set("ckpt", "step-4", {"c": c.hlc})
    kept = store.evict("ckpt", [("c", c.hlc)], proven_sets={("step-2", str(region_newest))})
    assert kept.objects == 0 and "version set step-4" in dict(kept.kept)["c"]


def test_a_proven_set_stamped_past_the_clocks_skew_bound_is_refused(store: ObjectStore) -> None:
    """It would raise the floor above every set readers may see: no set anyone made."""
    a = store.put("ckpt", "a", [b"a"])
    store.commit_set("ckpt", "step-1", {"a": a.hlc})
    ahead = HLC(a.hlc.wall_ms + 3_600_000, 0, "eu-west")
    with pytest.raises(ClockSkewError):
        store.evict("ckpt", [("a", a.hlc)], proven_sets={("x", str(ahead))})
    assert [s.version for s in store.versions("ckpt", "a")] == [a]
