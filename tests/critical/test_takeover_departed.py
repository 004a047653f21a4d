"""A takeover proof over a copy region whose holder departed (issue 13,
agents/placement/departures.py), on real agent processes and a real etcd.

eu-north has two agents at `r` = 1, eu-west and eu-central one each. An acked write is
held by eu-west and by one agent of eu-north; that agent is SIGKILLed and its lease
lapses. The new owner (us-east, where no agent runs: the real `SyncReplication` in the
test process, its `adopt` counted) makes a takeover pass over eu-west:

* with the departed agent's roster entry standing, eu-north's complete listing (its
  lone survivor's) is refused retriable: the pass decides nothing, eu-west keeps the
  write, and once the agent is back the write is adopted, not rewound;
* without it (the entry deleted, as the refusal removed: what an operator who accepts
  the loss does), the survivor's listing reads "held nowhere" and the pass rewinds the
  acked write from eu-west: the hole this closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from critical_helpers import kill_all, prepare_critical_world, wait_ready
from harness.agent_fixtures import clear_keyspace
from harness.agent_process import AgentProcess
from harness.fake_peers import StaticPeers
from test_takeover_regions import (
    OWNER,
    PLACEMENT,
    CountedAdopt,
    epoch_write,
    held_here,
    replicate,
    seeding_owner,
)
from waiting import until

from agents.placement.departures import roster_key, roster_of
from agents.replication.sync import SyncReplication
from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError

pytestmark = pytest.mark.integration

LAYOUT = (("eu-west", 1), ("eu-central", 1), ("eu-north", 2))
assert PLACEMENT.home == "eu-west"


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str
) -> Iterator[tuple[dict[str, list[AgentProcess]], ObjectStore]]:
    tmp_path = tmp_path_factory.mktemp("departed")
    clear_keyspace(etcd_endpoint)
    env = {
        **prepare_critical_world(tmp_path / "world", etcd_endpoint),
        "MERIDIAN_REGION_COPIES": "eu-west=1,eu-north=1",
        "MERIDIAN_REBALANCE_INTERVAL_S": "3600",
        "MERIDIAN_DEPARTURE_RECORDS": "1",
    }
    agents: dict[str, list[AgentProcess]] = {}
    source = ObjectStore(tmp_path / "source", clock=HybridClock("eu-west"))
    try:
        for region, count in LAYOUT:
            for n in range(count):
                proc = AgentProcess(
                    region,
                    tmp_path / f"{region}-{n}",
                    env,
                    tmp_path / f"{region}-{n}.log",
                    lease_ttl_s=3,
                )
                proc.spawn()
                agents.setdefault(region, []).append(proc)
        wait_ready(p for procs in agents.values() for p in procs)
        yield agents, source
    finally:
        kill_all(p for procs in agents.values() for p in procs)
        source.close()
        clear_keyspace(etcd_endpoint)


@pytest.fixture
async def coord(etcd_endpoint: str) -> AsyncIterator[EtcdCoordination]:
    async with EtcdCoordination([etcd_endpoint], timeout_s=5.0) as connected:
        yield connected


async def north_count_is(coord: EtcdCoordination, count: int) -> bool:
    kvs, _ = await coord.get_prefix(keys.agents_of("eu-north"))
    return len(kvs) == count


async def test_a_departed_holder_keeps_an_acked_write_from_being_rewound(
    world: tuple[dict[str, list[AgentProcess]], ObjectStore],
    coord: EtcdCoordination,
    tmp_path: Path,
) -> None:
    agents, source = world
    west, (north, holder) = agents["eu-west"][0], agents["eu-north"]
    addresses = {region: procs[0].address for region, procs in agents.items()}
    # A proof asks the owner's own region too; none runs in us-east, so eu-central's
    # agent (which holds nothing of these datasets) answers for it.
    addresses[OWNER] = addresses["eu-central"]

    def owner(name: str, adopt: CountedAdopt) -> SyncReplication:
        # The owner of record (etcd: `seeding_owner`), so that its rewinds pass the fence.
        store = ObjectStore(tmp_path / name, clock=HybridClock(OWNER))
        sync = SyncReplication(store, OWNER, StaticPeers(addresses), timeout_s=5.0, adopt=adopt)
        sync.retry_initial_s = sync.retry_max_s = 0.05
        return sync

    async def acked_write(ds: str) -> tuple[Version, HLC, int]:
        older_than = source.clock.now()  # the epoch began before the write
        epoch = await seeding_owner(coord, ds)
        data = f"acked in {ds}".encode()
        version = source.put(ds, "k", [data])
        for proc in (west, holder):  # acked: eu-west and eu-north hold it
            await replicate(proc, ds, "k", version, data, epoch)
        assert await held_here(north, ds, "k") == []
        return version, older_than, epoch

    kept_ds, lost_ds = "tri/departed-kept", "tri/departed-lost"
    kept, kept_since, kept_epoch = await acked_write(kept_ds)
    lost, lost_since, lost_epoch = await acked_write(lost_ds)

    # The eu-north holder is SIGKILLed; its lease lapses, its roster entry stays.
    holder.kill()
    await until(lambda: north_count_is(coord, 1), 30, "the holder's registration lapsing")
    kvs, _ = await coord.get_prefix(roster_of("eu-north"))
    assert len(kvs) == 2

    holder_id = _agent_id(holder)
    adopt = CountedAdopt()
    sync = owner("owner-kept", adopt)
    try:
        with pytest.raises(UnavailableError, match=holder_id) as caught:
            await sync._takeover_once(epoch_write(kept_ds, kept_epoch), "eu-west", kept_since)
        assert caught.value.retriable  # the pass is retried, not given up
        assert await held_here(west, kept_ds, "k") == [kept.hlc.text]  # not rewound
        assert adopt.calls == []
    finally:
        await sync.close()
        sync.store.close()

    # Without the refusal (the holder's entry gone, as an operator accepting the loss
    # does): the survivor's listing proves the acked write lone, and it is rewound.
    await coord.delete(roster_key("eu-north", holder_id))
    sync = owner("owner-lost", CountedAdopt())
    try:
        await sync._takeover_once(epoch_write(lost_ds, lost_epoch), "eu-west", lost_since)
        assert await held_here(west, lost_ds, "k") == []  # the acked write is gone
    finally:
        await sync.close()
        sync.store.close()
    assert lost.hlc.text

    # The holder comes back (rewriting its entry): the refused pass now finds the kept
    # write held in eu-north, and adopts it instead of rewinding it.
    holder.start()
    await until(lambda: north_count_is(coord, 2), 30, "the holder back")
    sync = owner("owner-back", adopt)
    try:

        async def passed() -> bool:
            try:
                await sync._takeover_once(epoch_write(kept_ds, kept_epoch), "eu-west", kept_since)
            except UnavailableError:
                return False
            return True

        await until(passed, 30, "the pass once the holder is back")
        assert await held_here(west, kept_ds, "k") == [kept.hlc.text]
        assert len(adopt.calls) == 1 and adopt.calls[0].startswith(f"k@{kept.hlc.text} ")
    finally:
        await sync.close()
        sync.store.close()


def _agent_id(proc: AgentProcess) -> str:
    event = proc.event("agent_ready")
    assert event is not None
    return str(event["id"])
