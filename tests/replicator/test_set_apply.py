"""The applier's path for a version set's event, against a real ObjectStore behind a
fake set port (the agent's ReplicateSet does the same two store calls): recorded at
once and visible only once every member is stored; a replay is `same`; the residency
guard refuses a region outside the residency (a refused transfer of `/set/<id>`, a
dead letter) and skips a region the placement does not name; a retriable failure is
retried, a final one dead-lettered; a set event in a batch of changes applies too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import repl_builders as b
from fakes.replicator import MemoryAgent, MemoryDeadLetters, MemoryReplicaRecords
from repl_rig import no_sleep

from agents.store import ObjectStore
from controlplane.domain.events import SetEvent
from controlplane.domain.hlc import HLC, HybridClock, system_ms
from controlplane.domain.version import Digest, Verdict, Version
from controlplane.domain.version_set import SetMember, VersionSet
from controlplane.errors import InvalidInputError, NotFoundError, UnavailableError
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Record
from meridian.convert import encode_set_event
from replicator import dlq
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.ports import ApplyOutcome, SetApplyResult
from replicator.shipper import ship_one

DS = "corpus/web"
_OUTCOMES = {
    Verdict.APPLY: ApplyOutcome.APPLIED,
    Verdict.SAME: ApplyOutcome.SAME,
    Verdict.OLDER: ApplyOutcome.OLDER,
    Verdict.COLLISION: ApplyOutcome.COLLISION,
}


class StoreSets:
    """`SetPort` over a store, as the agent's ReplicateSet applies a pushed set."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.failures: list[Exception] = []
        self.calls = 0

    async def apply_set(self, event: SetEvent) -> SetApplyResult:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        vs = event.version_set
        assert vs.hlc is not None
        verdict = self.store.apply_set(
            vs.dataset, vs.id, vs.hlc, {m.key: m.version for m in vs.members}
        )
        if verdict not in (Verdict.APPLY, Verdict.SAME):
            return SetApplyResult(_OUTCOMES[verdict], complete=False)
        missing = self.store.missing_members(vs.dataset, vs.id)
        return SetApplyResult(_OUTCOMES[verdict], complete=not missing, missing=tuple(missing))


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.store = ObjectStore(tmp_path / "root", clock=HybridClock("eu-central"))
        self.journal = RecordJournal(tmp_path / "journal.db")
        self.sets = StoreSets(self.store)
        self.agent = MemoryAgent()
        self.letters = MemoryDeadLetters()

    def applier(
        self, region: str = "eu-central", policy: CompiledPolicy | None = None, *, sets: bool = True
    ) -> Applier:
        current = policy or b.policy()
        return Applier(
            ReplicatorConfig(region=region, max_attempts=3),
            agent=self.agent,
            journal=self.journal,
            dead_letters=self.letters,
            policy=lambda: current,
            metrics=ReplicatorMetrics(region),
            sets=self.sets if sets else None,
            sleep=no_sleep,
        )

    def close(self) -> None:
        self.journal.close()
        self.store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


@pytest.fixture
async def members(world: World) -> AsyncIterator[dict[str, Version]]:
    """Three member versions made in eu-west (not yet stored here)."""
    now = system_ms()
    yield {
        f"shard-{i}": Version.put(HLC(now - 1000 + i, 0, "eu-west"), 5, Digest.of(b"shard"))
        for i in range(3)
    }


def set_event(
    members: dict[str, Version], set_id: str = "step-1", *, event_id: str = "ev-s1"
) -> SetEvent:
    vs = VersionSet(
        DS,
        set_id,
        tuple(SetMember(k, v.hlc) for k, v in sorted(members.items())),
        HLC(system_ms(), 0, "eu-west"),
    )
    return SetEvent(event_id=event_id, version_set=vs, origin_region="eu-west", policy_revision=3)


def rec(event: SetEvent, offset: int = 0) -> Record:
    return Record("meridian.changes", 1, offset, event.log_key.encode(), encode_set_event(event))


def store_member(store: ObjectStore, key: str, version: Version) -> None:
    store.apply(DS, key, version, [b"shard"])


async def test_a_set_is_recorded_at_once_visible_when_complete_and_a_replay_is_a_no_op(
    world: World, members: dict[str, Version]
) -> None:
    applier = world.applier()
    event = set_event(members)
    assert await applier.handle(rec(event)) == "applied"
    with pytest.raises(NotFoundError):
        world.store.get_set(DS)  # recorded, not visible: no member is here yet
    keys = sorted(members)
    for key in keys[:-1]:
        store_member(world.store, key, members[key])
    with pytest.raises(NotFoundError):
        world.store.get_set(DS)  # two of three: still not visible
    store_member(world.store, keys[-1], members[keys[-1]])
    shown = world.store.get_set(DS)
    assert shown.set_id == "step-1" and shown.hlc == event.version_set.hlc
    assert shown.members == {k: v.hlc for k, v in members.items()}

    assert await applier.handle(rec(event, offset=1)) == "same"  # the replay
    assert world.store.list_sets(DS) == [shown]
    assert world.journal.count() == 0  # the agent's own journal records the set
    assert world.letters.letters == []


async def test_a_region_outside_the_residency_refuses_it_and_records_the_refusal(
    world: World, members: dict[str, Version]
) -> None:
    policy = b.policy(b.placement(DS, replicas=("eu-central", "us-east"), residency=("EU",)))
    event = set_event(members)
    assert await world.applier("us-east", policy).handle(rec(event)) == "refused"
    assert world.sets.calls == 0  # not even asked: no byte, no record moves
    assert [reason for _, reason, _ in world.letters.letters] == [dlq.RESIDENCY]
    (row,) = world.journal.pending()
    assert (row.record.kind, row.record.op, row.record.set_id) == ("refused", "set", "step-1")
    sink = MemoryReplicaRecords()
    ship_one(sink, row.record)
    assert sink.versions == {} and sink.states == {}  # no object is invented for the set
    (transfer,) = sink.transfers.values()
    assert transfer.object == "/set/step-1" and transfer.outcome == "refused"
    assert transfer.to_region == "us-east" and transfer.version == str(event.version_set.hlc)


async def test_a_region_the_placement_does_not_name_skips_it(
    world: World, members: dict[str, Version]
) -> None:
    assert await world.applier("us-east").handle(rec(set_event(members))) == "skipped"
    assert world.sets.calls == 0 and world.store.list_sets(DS) == []


async def test_a_retriable_failure_is_retried_and_a_final_one_dead_lettered(
    world: World, members: dict[str, Version]
) -> None:
    applier = world.applier()
    world.sets.failures = [UnavailableError("agent away"), UnavailableError("agent away")]
    assert await applier.handle(rec(set_event(members))) == "applied"
    assert world.sets.calls == 3 and world.letters.letters == []

    world.sets.failures = [InvalidInputError("a bad set")]
    assert await applier.handle(rec(set_event(members, "step-2", event_id="ev-s2"))) == (
        "dead-lettered"
    )
    assert [reason for _, reason, _ in world.letters.letters] == [dlq.REJECTED]
    assert [s.set_id for s in world.store.list_sets(DS)] == ["step-1"]


async def test_without_a_set_port_the_event_is_dead_lettered_not_dropped(
    world: World, members: dict[str, Version]
) -> None:
    assert await world.applier(sets=False).handle(rec(set_event(members))) == "dead-lettered"
    assert [reason for _, reason, _ in world.letters.letters] == [dlq.REJECTED]


async def test_a_set_event_in_a_batch_of_changes_applies_in_its_place(
    world: World, members: dict[str, Version]
) -> None:
    event = set_event(members)
    records = [
        b.rec_of(b.put("a"), 0),
        rec(event, 1),
        b.rec_of(b.put("b"), 2),
    ]
    results = await world.applier().handle_many(records)
    assert results == ["applied", "applied", "applied"]
    assert sorted(world.agent.held) == [(DS, "a"), (DS, "b")]
    assert [s.set_id for s in world.store.list_sets(DS)] == ["step-1"]
