"""The controller's duties: errors are retried with backoff, never the end of a term.

Unit tests fake the catalog (a port); the etcd ones run against the private
three-member cluster, one of them through Toxiproxy to cut the link for less than
a lease TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

import pytest
from fakes.catalog import MemoryCatchUp, MemoryJournal, MemoryPlacements
from harness.ports import free_port
from structlog.testing import capture_logs

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.catalog.errors import CatalogInputError, CatalogUnavailableError
from controlplane.controller.daemon import ControllerConfig, RegionController
from controlplane.controller.duty import Backoff, Duty, Loop
from controlplane.controller.records import CatalogRecords
from controlplane.coordination.catalog_glue.sources import JournalEntry
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.coordination.timeutil import utcnow
from controlplane.errors import InvalidInputError
from controlplane.policy.publisher import CoordinationPolicyPublisher
from controlplane.stack.etcd import EtcdCluster

from .helpers import REGIONS, compiled_world, critical, publish_world, wait_until

World = tuple[MemoryPlacements, MemoryJournal, MemoryCatchUp]


# -- backoff and the duty loop ---------------------------------------------------------------
def test_backoff_doubles_to_its_ceiling_and_waits_longest_for_what_will_not_clear() -> None:
    b = Backoff(0.1, 1.0)
    assert [b.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.1
    assert b.next(retriable=False) == 1.0


class Flaky(Duty):
    name = "flaky"

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__("eu-west", retry_initial_s=0.01, retry_max_s=0.05)
        self.errors = errors
        self.calls = 0
        self.done = asyncio.Event()

    def loops(self) -> dict[str, Loop]:
        return {"work": self._work}

    async def _work(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.done.set()
        await asyncio.Event().wait()


async def test_a_duty_logs_and_retries_every_error_and_keeps_running() -> None:
    duty = Flaky(
        [
            CatalogUnavailableError("the catalog at postgresql://db is unreachable"),
            RuntimeError("an untranslated driver error"),
            InvalidInputError("a bad row"),
        ]
    )
    with capture_logs() as logs:
        async with duty:
            await asyncio.wait_for(duty.done.wait(), 5)
            assert duty.running
    assert duty.calls == 4
    retries = [e for e in logs if e["event"] == "duty_retry"]
    assert [(e["retriable"], e["log_level"]) for e in retries] == [
        (True, "warning"),
        (False, "error"),
        (False, "error"),
    ]
    assert retries[0]["error"].startswith("CatalogUnavailableError: the catalog")
    assert [e["retry_in_s"] for e in retries] == [0.01, 0.05, 0.05]


# -- catalog records through an outage ----------------------------------------------------------
class DownJournal(MemoryJournal):
    """The memory journal behind a catalog that can be 'down'."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise CatalogUnavailableError("the catalog cannot be reached (test)")

    def append(self, entry: JournalEntry) -> None:
        self._check()
        super().append(entry)

    def missing(self, ids: Sequence[str]) -> set[str]:
        self._check()
        return super().missing(ids)

    def incomplete_versions(self, dataset: str, region: str) -> list[str]:
        self._check()
        return ["shard-0@v1"]


def _entry(dataset: str, epoch: int) -> JournalEntry:
    now: datetime = utcnow()
    return JournalEntry(
        id=f"{dataset}@{epoch}",
        dataset=dataset,
        from_region="eu-west",
        to_region="eu-central",
        epoch=epoch,
        kind="automatic",
        reason="lease expired",
        actor="t",
        detected_at=now,
        started_at=now,
        completed_at=now,
    )


def test_rows_refused_by_a_down_catalog_wait_in_order_and_say_the_rpo_is_unknown() -> None:
    journal = DownJournal()
    records = CatalogRecords(journal, journal)
    assert records.incomplete_versions("ckpt/a", "eu-central") == ["shard-0@v1"]
    journal.down = True
    assert records.incomplete_versions("ckpt/b", "eu-central") == []  # not measurable
    records.append(_entry("ckpt/b", 7))
    records.append(_entry("ckpt/c", 8))
    records.append(_entry("ckpt/b", 7))  # a repeat is kept once
    assert records.pending == 2 and journal.entries == {}
    with pytest.raises(CatalogUnavailableError):
        records.flush()
    assert records.pending == 2
    journal.down = False
    assert records.flush() == 2
    assert records.pending == 0
    assert list(journal.entries) == ["ckpt/b@7", "ckpt/c@8"]
    b = journal.entries["ckpt/b@7"]
    assert b.details["rpo_versions_unknown"] is True
    assert "cannot be reached" in str(b.details["rpo_error"])
    assert "rpo_versions_unknown" not in journal.entries["ckpt/c@8"].details
    records.append(_entry("ckpt/d", 9))  # the catalog is up: written at once
    assert records.pending == 0 and "ckpt/d@9" in journal.entries


def test_a_row_refused_for_good_is_set_aside_and_the_rest_are_written() -> None:
    """One row the catalog will never take (not retriable) must not block later ones."""

    class PickyJournal(DownJournal):
        def append(self, entry: JournalEntry) -> None:
            self._check()
            if entry.dataset == "ckpt/bad":
                raise CatalogInputError("failover kind 'x' is not one of ... (test)")
            super().append(entry)

    journal = PickyJournal()
    records = CatalogRecords(journal, journal)
    journal.down = True
    for name, epoch in (("ckpt/a", 1), ("ckpt/bad", 2), ("ckpt/c", 3)):
        records.append(_entry(name, epoch))
    journal.down = False
    assert records.flush() == 2
    assert list(journal.entries) == ["ckpt/a@1", "ckpt/c@3"]
    assert records.pending == 0 and list(records.refused) == ["ckpt/bad@2"]


# -- etcd trouble does not give the lease up -------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
async def test_a_transient_etcd_cut_keeps_the_lease_and_the_duties_resume(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World, toxiproxy_url: str
) -> None:
    toxi = ToxiproxyClient(toxiproxy_url, timeout_s=5)
    port = free_port()
    listen, proxy = f"127.0.0.1:{port}", f"ctl-etcd-cut-{port}"
    await asyncio.to_thread(toxi.create_proxy, proxy, listen, etcd3.endpoints[0])
    source, journal, probe = world
    west_coord = EtcdCoordination([listen], timeout_s=0.5)
    # The cut (2 s) is a quarter of the lease: renewed at most every second, and retried
    # through a channel that may still be backing off after the cut, the lease keeps
    # seconds of room on a loaded machine (at half a 4 s TTL it kept about one).
    ttl, cut_s = 8, 2.0
    config = ControllerConfig("eu-west", "w", lease_ttl_s=ttl, reconcile_interval_s=0.3)
    own = Ownership(coord)
    try:  # from the proxy's creation on: whatever fails, the proxy is deleted
        await publish_world(coord, source)
        await west_coord.connect()
        async with RegionController(west_coord, journal, probe, config) as west:
            assert await wait_until(lambda: _owned(own, "eu-west", 6), 10)
            before = await coord.get(keys.alive("eu-west"))
            assert before is not None
            with capture_logs() as logs:
                await asyncio.to_thread(toxi.disable, proxy)
                await asyncio.sleep(cut_s)  # every etcd call of the duties fails meanwhile
                await asyncio.to_thread(toxi.enable, proxy)
                # A dataset homed here, applied after the cut: the claims duty resumed.
                grown = MemoryPlacements(REGIONS, [*source.placements(), critical("ckpt/new")])
                await CoordinationPolicyPublisher(coord).publish(compiled_world(grown, 2))
                assert await wait_until(lambda: _owned(own, "eu-west", 7), 10)
            after = await coord.get(keys.alive("eu-west"))
            assert after is not None
            assert (after.lease, after.create_revision) == (before.lease, before.create_revision)
            assert west.active.is_set()
            assert (
                west.metrics.registry.get_sample_value("meridian_controller_step_downs_total") == 0
            )
            assert not [e for e in logs if e["event"] == "step_down"]
            assert [e for e in logs if e["event"] == "duty_retry"], "the cut was not felt"

            async def tracked() -> bool:
                # Tracked once the claim's reply is back (through the proxy), which may
                # be after etcd shows it to another connection.
                return west.owned.get("ckpt/new", 0) > 0

            assert await wait_until(tracked, 5)
    finally:
        await west_coord.close()
        await asyncio.to_thread(toxi.delete_proxy, proxy)


@pytest.mark.integration
async def test_with_no_policy_applied_nothing_is_claimed_or_moved(
    coord: EtcdCoordination, etcd3: EtcdCluster, world: World
) -> None:
    source, journal, probe = world
    await publish_world(coord, source)
    config = ControllerConfig("eu-central", "c", lease_ttl_s=2, reconcile_interval_s=0.2)
    own = Ownership(coord)
    async with (
        EtcdCoordination(etcd3.endpoints, timeout_s=3) as c,
        RegionController(c, journal, probe, config) as central,
    ):
        assert await wait_until(lambda: _true(central.active.is_set()), 5)
        await coord.delete(keys.POLICY_CURRENT)
        await central.view.wait_for(lambda p: p is None, 5)
        # eu-west owns everything and is dead: with no policy, nothing may move.
        for p in source.placements():
            await own.claim(p.dataset, "eu-west", expect_epoch=0, reason="t", actor="t")
        with capture_logs() as logs:
            moved = await central.fail_over("eu-west", detected_at_monotonic=0.0)
        assert moved == 0
        assert any(e.get("reason") == "no policy is applied" for e in logs)
        owners = await own.list()
        assert {o.region for o in owners.values()} == {"eu-west"}
        assert journal.entries == {}


async def _owned(own: Ownership, region: str, n: int) -> bool:
    owners = await own.list()
    return sum(1 for o in owners.values() if o.region == region) == n


async def _true(value: bool) -> bool:
    return value
