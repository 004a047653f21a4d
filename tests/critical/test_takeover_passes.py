"""Takeover passes are bounded (agents/replication/sync.py): an agent that starts as
the owner of many critical datasets begins a pass per dataset and copy region, but
only `takeover_passes` of them list and push at a time, and a (dataset, region) never
has two passes at once (asked again while one runs, it runs once more after it).

A unit test: the pass itself (`_takeover_once`, which lists and pushes over gRPC) is
replaced by a probe that counts how many run at once; the store is a real one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from waiting import until

from agents.admission import Admitted
from agents.replication.sync import SyncReplication
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.placement import Placement

REPLICAS = ("eu-central", "eu-north")


def placement(dataset: str) -> Placement:
    return Placement(
        dataset=dataset,
        policy="crit",
        dataset_class="critical",
        home="eu-west",
        replicas=REPLICAS,
        residency=("EU",),
        rpo_s=0,
        ack="quorum",
        failover_mode="manual",
        failover_order=REPLICAS,
    )


class NoPeers:
    async def address(self, region: str) -> str:
        return f"{region}.invalid:1"

    def forget(self, region: str) -> None:
        pass


class Probe:
    """Stands in for one pass: counts passes at once, overall and per pair."""

    def __init__(self) -> None:
        self.running: list[tuple[str, str]] = []
        self.most = 0
        self.twice: list[tuple[str, str]] = []
        self.done: list[tuple[str, str]] = []
        self.release = asyncio.Event()

    async def __call__(
        self, write: CommittedWrite, region: str, older_than: HLC
    ) -> tuple[int, int, int]:
        pair = (write.dataset, region)
        if pair in self.running:
            self.twice.append(pair)
        self.running.append(pair)
        self.most = max(self.most, len(self.running))
        try:
            await asyncio.wait_for(self.release.wait(), timeout=10)
        finally:
            self.running.remove(pair)
        self.done.append(pair)
        return 0, 0, 0


async def test_takeover_passes_are_bounded(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), takeover_passes=3)
    probe = Probe()
    sync._takeover_once = probe  # type: ignore[method-assign]
    datasets = [f"tri/d{n}" for n in range(8)]
    try:
        for ds in datasets:
            sync.took_over(Admitted(placement(ds), 5, 1), ds, store.clock.now())
        await until(lambda: len(probe.running) == 3, 5, "three passes running")
        probe.release.set()
        await until(lambda: len(probe.done) == 2 * len(datasets), 10, "every pass done")
        assert probe.most == 3
    finally:
        await sync.close()
        store.close()


async def test_a_pass_asked_again_while_it_runs_runs_once_more_after_it(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "store", clock=HybridClock("eu-west"))
    sync = SyncReplication(store, "eu-west", NoPeers(), takeover_passes=100)
    probe = Probe()
    sync._takeover_once = probe  # type: ignore[method-assign]
    ds = "tri/again"
    try:
        sync.took_over(Admitted(placement(ds), 5, 1), ds, store.clock.now())
        await until(lambda: len(probe.running) == 2, 5, "both passes running")
        # Asked again for a pair while its pass runs (an adopt spreads this way), twice.
        for _ in range(2):
            again = CommittedWrite(Admitted(placement(ds), 5, 1), ds)
            sync._start_pass(again, "eu-central", store.clock.now())
        probe.release.set()
        await until(lambda: len(probe.done) == 3, 10, "every pass done")
        assert probe.twice == []
        assert sorted(probe.done) == [(ds, "eu-central"), (ds, "eu-central"), (ds, "eu-north")]
    finally:
        await sync.close()
        store.close()
