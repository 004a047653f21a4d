"""Records, backlog, status and resync against a real catalog (SQLite, policy applied
and published through the CLI), with a fake agent.

- the backlog gauges are computed from the catalog, so a replicator that starts
  (or restarts) with a backlog reports it at once, and 0 once it is applied;
- a copy that fails `max_attempts` times is `failed` in the catalog with its last
  error, and `replication status --state failed` says why;
- while the catalog is down, records wait in the journal and the data path goes on;
- `replication resync` re-drives objects written before the region had them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import repl_builders as b
from fakes.coordination import MemoryCoordination
from fakes.replicator import MemoryAgent, MemoryReplicaRecords
from harness.cli_schema import check_output
from harness.controllers import run_cli
from repl_rig import Rig, RigFactory
from repl_world import prepare_world
from structlog.testing import capture_logs
from waiting import until

from agents.errors import ResidencyError
from controlplane.catalog.api import Catalog, open_catalog
from controlplane.coordination.protocols import keys
from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError
from controlplane.policy.current import PolicyView
from controlplane.policy.placer import place
from replicator.backfill import Backfill
from replicator.backlog import BacklogProbe
from replicator.journal import RecordJournal, ReplicaRecord
from replicator.ports import Source
from replicator.resync import ResyncItem, drive_resync, plan_resync
from replicator.shipper import RecordShipper

pytestmark = pytest.mark.integration

DS = "corpus/records"
POLICY = b.policy(b.placement(DS, replicas=("eu-central", "eu-north")))


@pytest.fixture
def world(tmp_path: Path, etcd_endpoint: str, kafka_bootstrap: str) -> dict[str, str]:
    return prepare_world(tmp_path / "world", etcd_endpoint, kafka_bootstrap)


@pytest.fixture
def catalog(world: dict[str, str]) -> Iterator[Catalog]:
    cat = open_catalog(world["MERIDIAN_CATALOG"], placer=place)
    yield cat
    cat.close()


def written_at_origin(catalog: Catalog, event: ChangeEvent) -> None:
    """What the origin agent's recorder ships: the version, completed in its region."""
    v = event.version
    catalog.register_version(
        event.dataset,
        event.key,
        str(v.hlc),
        str(v.digest) if v.digest else "",
        size=v.size,
        origin_region=event.origin_region,
        hlc=str(v.hlc),
        op=v.op,
    )
    catalog.set_replica_state(
        event.dataset,
        event.key,
        str(v.hlc),
        event.origin_region,
        "completed",
        digest=str(v.digest) if v.digest else None,
    )


def status(world: dict[str, str], *args: str) -> list[dict[str, object]]:
    done = run_cli(["replication", "status", "--dataset", DS, *args, "--output", "json"], world)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


async def test_backlog_is_read_from_the_catalog_at_start_and_drains_to_zero(
    world: dict[str, str], catalog: Catalog, rig_factory: RigFactory
) -> None:
    t = system_ms() - 30_000
    events = [b.put(f"k{i}", f"v{i}".encode(), wall_ms=t + i, dataset=DS) for i in range(3)]
    for e in events:
        written_at_origin(catalog, e)
    rig: Rig = rig_factory(region="eu-central", policy=POLICY)
    probe = BacklogProbe(catalog, "eu-central", rig.metrics)
    # A replicator (re)starting now: its first refresh is the true backlog.
    found = await probe.refresh()
    lag, pending, rpo = found[DS]
    assert pending == 3 and 29 < lag < 120
    # The lag's target beside it (the Prometheus rules divide one by the other).
    assert rpo == 30.0  # `rpo: 30s` in the applied policy (repl_world.POLICY)
    assert rig.metric("meridian_dataset_rpo_seconds", dataset=DS, region="eu-central") == rpo
    assert rig.metric("meridian_replication_pending", dataset=DS, region="eu-central") == 3
    assert status(world, "--region", "eu-central")[0]["pending"] == 3
    # Applied and recorded: the backlog is gone, in the gauges and in `status` alike.
    for i, e in enumerate(events):
        await rig.applier.handle(b.rec_of(e, i))
    shipper = RecordShipper(rig.journal, catalog)
    assert await shipper.ship_once() == 3
    found = await probe.refresh()
    assert found[DS] == (0.0, 0, rpo)
    assert rig.metric("meridian_replication_lag_seconds", dataset=DS, region="eu-central") == 0
    rows = status(world)
    check_output("replication_status", rows)
    by_region = {r["region"]: r for r in rows}
    assert by_region["eu-central"] == {
        "dataset": DS,
        "region": "eu-central",
        "completed": 3,
        "pending": 0,
        "failed": 0,
        "lag_s": 0.0,
        "records_behind_s": None,  # no agent of eu-central registered in this world
    }
    assert by_region["eu-north"]["pending"] == 3  # not there yet: still counted


async def test_a_version_made_here_is_a_backlog_here_only_once_its_bytes_were_lost_here(
    world: dict[str, str], catalog: Catalog, rig_factory: RigFactory
) -> None:
    # Startup repair in eu-central found the bytes of one of its own versions lost and
    # recorded its replica there `failed`: only a fetch from another region brings them
    # back, so it is a backlog there, in the gauges as in `status`; a version made there
    # and held there is not, nor one whose record is still on its way.
    t = system_ms() - 30_000
    held = b.put("held", wall_ms=t, origin="eu-central", dataset=DS)
    lost = b.put("lost", wall_ms=t + 1, origin="eu-central", dataset=DS)
    written_at_origin(catalog, held)
    hlc, digest = str(lost.version.hlc), str(lost.version.digest)
    catalog.register_version(DS, "lost", hlc, digest, origin_region="eu-central", hlc=hlc)
    rig = rig_factory(region="eu-central", policy=POLICY)
    probe = BacklogProbe(catalog, "eu-central", rig.metrics)
    rpo = 30.0
    assert (await probe.refresh())[DS] == (0.0, 0, rpo)

    catalog.set_replica_state(DS, "lost", hlc, "eu-central", "failed", error="bytes lost")
    lag, pending, _ = (await probe.refresh())[DS]
    assert pending == 1 and 29 < lag < 120
    assert rig.metric("meridian_replication_pending", dataset=DS, region="eu-central") == 1
    (row,) = status(world, "--region", "eu-central")
    assert (row["failed"], row["pending"]) == (1, 0) and 29 < row["lag_s"] < 120  # type: ignore[operator]

    # Fetched back from a region that holds it (resync): no backlog any more.
    catalog.set_replica_state(DS, "lost", hlc, "eu-central", "pending")
    catalog.set_replica_state(DS, "lost", hlc, "eu-central", "completed", digest=digest)
    assert (await probe.refresh())[DS] == (0.0, 0, rpo)


async def test_a_failed_copy_is_shown_with_its_error_and_resync_redrives_it(
    world: dict[str, str], catalog: Catalog, rig_factory: RigFactory
) -> None:
    rig = rig_factory(region="eu-central", policy=POLICY, max_attempts=2)
    event = b.put("big", b"x" * 64, inline=False, dataset=DS)
    written_at_origin(catalog, event)
    rig.agent.failures = [UnavailableError("eu-west agent unreachable")] * 2
    assert await rig.applier.handle(b.rec_of(event)) == "failed"
    await RecordShipper(rig.journal, catalog).ship_once()
    (row,) = status(world, "--region", "eu-central", "--state", "failed")
    assert row["failed"] == 1 and row["pending"] == 0
    (obj,) = row["objects"]  # type: ignore[misc]
    assert obj["attempts"] == 2
    assert obj["last_error"] == "UnavailableError: eu-west agent unreachable"
    assert "replication resync" in obj["why"]
    # Resync: the plan names it (and the objects eu-north never had), then re-drives it.
    items = plan_resync(catalog, catalog.list_placements(), "eu-central")
    assert [(i.key, i.state, i.holders) for i in items] == [("big", "failed", ("eu-west",))]
    agent = MemoryAgent()

    async def agents_of(region: str) -> list[Source]:
        return [Source(region, f"{region}.agent:7400")]

    results = await drive_resync(
        items,
        region="eu-central",
        agent=agent,
        records=catalog,
        policy=POLICY,
        agents_of=agents_of,
    )
    assert [r.outcome for r in results] == ["applied"]
    assert agent.fetch_sources == [[Source("eu-west", "eu-west.agent:7400")]]
    (after,) = status(world, "--region", "eu-central")
    assert (after["completed"], after["pending"], after["failed"]) == (1, 0, 0)


def test_resync_dry_run_prints_the_plan_and_changes_nothing(
    world: dict[str, str], catalog: Catalog
) -> None:
    e = b.put("old", dataset=DS)
    written_at_origin(catalog, e)  # written before eu-north held anything
    done = run_cli(
        [
            "replication",
            "resync",
            "--dataset",
            "corpus/*",
            "--region",
            "eu-north",
            "--dry-run",
            "--output",
            "json",
        ],
        world,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    assert [(p["key"], p["state"], p["holders"]) for p in plan] == [("old", "missing", ["eu-west"])]
    assert catalog.replica_status(DS, region="eu-north") == []


async def test_records_wait_in_the_journal_while_the_catalog_is_down(tmp_path: Path) -> None:
    journal = RecordJournal(tmp_path / "j.db")
    sink = MemoryReplicaRecords(down=True)
    for e in [b.put(f"k{i}") for i in range(3)]:
        journal.append(
            ReplicaRecord(
                kind="replica",
                event_id=e.event_id,
                dataset=e.dataset,
                key=e.key,
                hlc=str(e.version.hlc),
                op="put",
                size=e.version.size,
                digest=str(e.version.digest),
                origin_region="eu-west",
                set_id=None,
                region="eu-central",
                state="completed",
                at=datetime.now(UTC),
            )
        )
    shipper = RecordShipper(journal, sink)
    with pytest.raises(UnavailableError):
        await shipper.ship_once()
    assert journal.count() == 3 and sink.states == {}
    sink.down = False
    assert await shipper.ship_once() == 3
    assert journal.count() == 0
    assert {k[1]: v[0] for k, v in sink.states.items()} == {f"k{i}": "completed" for i in range(3)}
    journal.close()


async def test_a_region_added_as_a_replica_is_backfilled_live(catalog: Catalog) -> None:
    old = b.put("before", b"written before eu-north was a replica", dataset=DS)
    written_at_origin(catalog, old)
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(b.placement(DS), revision=4).to_json())
    agent = MemoryAgent()

    async def agents_of(region: str) -> list[Source]:
        return [Source(region, f"{region}.agent:7400")]

    async with PolicyView(coord) as view:
        backfill = Backfill(view, catalog, agent, agents_of, "eu-north")
        async with backfill:
            wider = b.placement(DS, replicas=("eu-central", "eu-north"))
            await coord.put(keys.POLICY_CURRENT, b.policy(wider, revision=5).to_json())
            await asyncio.wait_for(backfill.ran.wait(), 30)
    assert backfill.runs == 1
    assert agent.held[(DS, "before")] == old.version
    (row,) = catalog.replica_status(DS, region="eu-north")
    assert row.state == "completed"


class FlakyCatalog:
    """The catalog, whose first `failures` reads of what a region lacks fail."""

    def __init__(self, inner: Catalog, failures: int) -> None:
        self.inner, self.failures = inner, failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def incomplete_versions(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise UnavailableError("the catalog did not answer (test fault)")
        return self.inner.incomplete_versions(*args, **kwargs)


async def agents_at(region: str) -> list[Source]:
    return [Source(region, f"{region}.agent:7400")]


WIDER = b.placement(DS, replicas=("eu-central", "eu-north"))


async def test_a_backfill_that_failed_is_retried_until_it_finishes(
    catalog: Catalog, tmp_path: Path
) -> None:
    old = b.put("before", b"written before eu-north was a replica", dataset=DS)
    written_at_origin(catalog, old)
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(b.placement(DS), revision=4).to_json())
    agent, flaky = MemoryAgent(), FlakyCatalog(catalog, failures=2)
    state = tmp_path / "backfill.json"
    async with PolicyView(coord) as view:
        backfill = Backfill(
            view,
            flaky,  # type: ignore[arg-type]
            agent,
            agents_at,
            "eu-north",
            state_path=state,
            retry_initial_s=0.05,
            retry_max_s=0.1,
        )
        async with backfill:
            await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
            await until(lambda: backfill.runs == 1, 30, what="the backfill, retried, to finish")
    assert flaky.failures == 0
    assert agent.held[(DS, "before")] == old.version
    assert json.loads(state.read_text()) == {"region": "eu-north", "done": [DS]}


async def test_a_dataset_placed_here_while_the_replicator_was_down_is_backfilled_at_start(
    catalog: Catalog, tmp_path: Path
) -> None:
    old = b.put("before", b"written before eu-north was a replica", dataset=DS)
    written_at_origin(catalog, old)
    coord = MemoryCoordination()
    # What the last run kept: nothing placed in eu-north was backfilled. Then, while it
    # was down, a revision placed the dataset here.
    state = tmp_path / "backfill.json"
    state.write_text(json.dumps({"region": "eu-north", "done": []}))
    await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
    agent = MemoryAgent()
    async with PolicyView(coord) as view:
        backfill = Backfill(view, catalog, agent, agents_at, "eu-north", state_path=state)
        async with backfill:
            await until(lambda: backfill.runs == 1, 30, what="the backfill at start")
    assert agent.held[(DS, "before")] == old.version
    assert json.loads(state.read_text())["done"] == [DS]


async def test_a_first_start_without_state_takes_what_is_placed_then_as_done(
    catalog: Catalog, tmp_path: Path
) -> None:
    written_at_origin(catalog, b.put("before", b"carried by the change log", dataset=DS))
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
    state, agent = tmp_path / "backfill.json", MemoryAgent()
    async with PolicyView(coord) as view:
        backfill = Backfill(view, catalog, agent, agents_at, "eu-north", state_path=state)
        async with backfill:
            await until(state.exists, 30, what="the backfill state to be written")
    assert json.loads(state.read_text()) == {"region": "eu-north", "done": [DS]}
    assert backfill.runs == 0 and agent.held == {}


async def test_a_dataset_whose_write_was_skipped_here_is_backfilled_again(
    catalog: Catalog, tmp_path: Path
) -> None:
    # DS was backfilled here; a write of it was then skipped (the policy of that moment
    # did not place it here), and the loop never saw that revision (coalesced, or it
    # was busy). The skip takes DS out of what was backfilled, durably before the skip
    # is reported done, and the loop backfills it again.
    state = tmp_path / "backfill.json"
    state.write_text(json.dumps({"region": "eu-north", "done": [DS]}))
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
    skipped = b.put("while-away", b"written while eu-north was not placed", dataset=DS)
    written_at_origin(catalog, skipped)
    agent = MemoryAgent()
    async with PolicyView(coord) as view:
        backfill = Backfill(view, catalog, agent, agents_at, "eu-north", state_path=state)
        async with backfill:
            # At once: the state is loaded before start returns, so a skip the applier
            # reports before the loop first looks is not lost.
            await backfill.forget(DS)
            assert json.loads(state.read_text())["done"] == []  # saved before it returned
            await until(lambda: backfill.runs == 1, 30, what="the backfill of DS again")
    assert agent.held[(DS, "while-away")] == skipped.version
    assert json.loads(state.read_text())["done"] == [DS]


async def test_the_applier_tells_of_each_event_it_does_not_copy(rig_factory: RigFactory) -> None:
    rig = rig_factory(region="us-east")  # the default placement does not name us-east
    told: list[str] = []

    async def not_copied(dataset: str) -> None:
        told.append(dataset)

    rig.applier.on_not_copied = not_copied
    assert await rig.applier.handle_many([b.rec_of(b.put("a"))]) == ["skipped"]
    assert told == ["corpus/web"]


async def test_an_agents_refusal_restarts_the_backfill_once_per_revision(
    rig_factory: RigFactory,
) -> None:
    # The policy places the dataset here, but the agent refuses (its view lags): the
    # backfill is told once under this revision, not at every refused event.
    rig = rig_factory()
    told: list[str] = []

    async def not_copied(dataset: str) -> None:
        told.append(dataset)

    rig.applier.on_not_copied = not_copied
    rig.agent.failures.extend(
        ResidencyError(f"the agent's view refuses it ({n})") for n in range(3)
    )
    events = [b.put(f"k{n}") for n in range(3)]
    results = [await rig.applier.handle(b.rec_of(e, n)) for n, e in enumerate(events)]
    assert results == ["refused"] * 3
    assert told == ["corpus/web"]


async def test_a_write_skipped_while_its_dataset_is_backfilled_is_backfilled_again(
    catalog: Catalog, tmp_path: Path
) -> None:
    # The backfill of DS is running (its catalog read done) when a write of DS is
    # skipped: that run does not mark DS done, and DS is backfilled once more.
    state = tmp_path / "backfill.json"
    state.write_text(json.dumps({"region": "eu-north", "done": []}))
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
    agent = MemoryAgent()
    async with PolicyView(coord) as view:
        backfill = Backfill(view, catalog, agent, agents_at, "eu-north", state_path=state)
        real = backfill._backfill
        calls = 0

        async def skipped_meanwhile(policy: Any, placements: Any) -> bool:
            nonlocal calls
            calls += 1
            done = await real(policy, placements)
            if calls == 1:
                await backfill.forget(DS)  # a skip reported during the first run
            return done

        backfill._backfill = skipped_meanwhile  # type: ignore[method-assign]
        async with backfill:
            await until(lambda: backfill.runs == 2, 30, what="DS backfilled once more")
    assert json.loads(state.read_text())["done"] == [DS]


async def test_a_backfill_the_agent_refuses_is_retried_until_its_view_admits_it(
    catalog: Catalog, tmp_path: Path
) -> None:
    # The policy places DS here, but the agent's view lags and refuses the copies: the
    # backfill is not counted finished (the writes it refused would never come).
    old = b.put("before", b"written before eu-north was a replica", dataset=DS)
    written_at_origin(catalog, old)
    state = tmp_path / "backfill.json"
    state.write_text(json.dumps({"region": "eu-north", "done": []}))
    coord = MemoryCoordination()
    await coord.put(keys.POLICY_CURRENT, b.policy(WIDER, revision=5).to_json())
    agent = MemoryAgent()
    agent.failures.append(ResidencyError("the agent's view does not place it here yet"))
    async with PolicyView(coord) as view:
        backfill = Backfill(
            view,
            catalog,
            agent,
            agents_at,
            "eu-north",
            state_path=state,
            retry_initial_s=0.05,
            retry_max_s=0.1,
        )
        with capture_logs() as logs:
            async with backfill:
                await until(lambda: backfill.runs == 1, 30, what="the backfill, retried")
    assert [e["event"] for e in logs].count("backfill_refused_by_agent") == 1
    assert agent.held[(DS, "before")] == old.version
    assert json.loads(state.read_text())["done"] == [DS]


async def test_resync_of_a_delete_keeps_the_copy_of_a_retain_dataset() -> None:
    # `deletes: retain`: the applier records a delete and keeps the copy; a resync of
    # that delete (the region was down when it happened) must do the same.
    recorded: list[tuple[str, str, str]] = []

    class Records:
        def set_replica_state(
            self, dataset: str, key: str, hlc: str, region: str, state: str, **_: object
        ) -> None:
            recorded.append((key, region, state))

    agent = MemoryAgent()
    tomb = Version.delete(HLC(system_ms(), 0, "eu-west"))
    item = ResyncItem(DS, "k", tomb, "missing", ("eu-west",), retain_deletes=True)
    results = await drive_resync(
        [item],
        region="eu-north",
        agent=agent,
        records=Records(),  # type: ignore[arg-type]
        policy=POLICY,
        agents_of=agents_at,
    )
    assert [r.outcome for r in results] == ["retained"]
    assert agent.calls == []  # no delete sent to the agent
    assert recorded == [("k", "eu-north", "completed")]
