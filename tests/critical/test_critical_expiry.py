"""Tombstones of a critical dataset expire only once every copy region holds the
delete (or nothing of the object): real agent processes of the critical world with a
short retention, etcd. A replica that missed the delete and still shows the older put
keeps the tombstone in every region, for a takeover there would adopt that put."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from critical_helpers import put, running_agents
from harness.agent_process import AgentProcess
from waiting import until

from agents.client import AgentClient, ObjectInfo
from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HybridClock

pytestmark = pytest.mark.integration

REGIONS = ("eu-west", "eu-central", "eu-north")


def retention_env(critical_world: dict[str, str], retention_s: int) -> dict[str, str]:
    return {
        **critical_world,
        "MERIDIAN_TOMBSTONE_RETENTION_S": str(retention_s),
        "MERIDIAN_TOMBSTONE_EXPIRY_INTERVAL_S": "0.3",
    }


async def held(proc: AgentProcess, dataset: str) -> list[ObjectInfo]:
    async with AgentClient(proc.address) as client:
        return await client.list(dataset, include_deleted=True)


async def keys_held(proc: AgentProcess, dataset: str) -> list[str]:
    return [o.key for o in await held(proc, dataset)]


async def test_a_delete_every_region_holds_is_forgotten_everywhere(
    tmp_path: Path, critical_world: dict[str, str], coord: EtcdCoordination
) -> None:
    with running_agents(tmp_path, retention_env(critical_world, 4)) as procs:
        await forgotten_everywhere(procs, coord)


async def forgotten_everywhere(procs: dict[str, AgentProcess], coord: EtcdCoordination) -> None:
    west = procs["eu-west"]
    await Ownership(coord).claim("tri/x", "eu-west", expect_epoch=0, reason="home", actor="t")
    await put(west.address, "tri/x", "kept", b"a checkpoint still in use")
    await put(west.address, "tri/x", "old", b"a checkpoint rotated out")
    async with AgentClient(west.address) as client:
        await client.delete("tri/x", "old")

    async def everywhere(keys: list[str]) -> bool:
        held = await asyncio.gather(*(keys_held(p, "tri/x") for p in procs.values()))
        return all(h == keys for h in held)

    # The push of the delete reaches the third region too (the ack needs two of three).
    await until(lambda: everywhere(["kept", "old"]), 20, what="the delete held everywhere")
    await until(lambda: everywhere(["kept"]), 40, what="the delete forgotten everywhere")


async def test_a_replica_that_missed_the_delete_keeps_it_in_every_region(
    tmp_path: Path, critical_world: dict[str, str], coord: EtcdCoordination
) -> None:
    # Long enough to stop eu-north before the delete may expire there.
    with running_agents(tmp_path, retention_env(critical_world, 20)) as procs:
        await kept_everywhere(procs, coord, tmp_path)


async def kept_everywhere(
    procs: dict[str, AgentProcess], coord: EtcdCoordination, tmp_path: Path
) -> None:
    west, central, north = (procs[r] for r in REGIONS)
    await Ownership(coord).claim("tri/y", "eu-west", expect_epoch=0, reason="home", actor="t")
    await put(west.address, "tri/y", "old", b"a checkpoint rotated out")
    async with AgentClient(west.address) as client:
        await client.delete("tri/y", "old")
        gone = (await client.list("tri/y", include_deleted=True))[0].version
    assert gone.is_tombstone

    async def north_holds_the_delete() -> bool:
        return [o.version for o in await held(north, "tri/y")] == [gone]

    await until(north_holds_the_delete, 20, what="the delete pushed to eu-north")
    # eu-north as if it had missed the delete: stopped, its tombstone taken back, so it
    # comes back showing the put (no owner pushes it the delete again: it was acked).
    assert north.stop() == 0
    with ObjectStore(tmp_path / "eu-north", clock=HybridClock("eu-north")) as store:
        assert store.rewind("tri/y", "old", gone)
    north.start()
    assert [o.version.is_tombstone for o in await held(north, "tri/y")] == [False]
    for proc in (west, central):

        def kept(proc: AgentProcess = proc) -> list[dict[str, object]]:
            # A pass while eu-north was down (a slow restart) counts it unanswered.
            return [
                e
                for e in proc.events()
                if e.get("event") == "tombstones_kept" and "unanswered" not in e
            ]

        # Three passes that found eu-north showing the put, and the delete still here.
        await until(lambda: len(kept()) >= 3, 60, what="passes keeping the delete")
        assert all(e["missed_delete"] == {"eu-north": 1} for e in kept()), kept()
        assert [o.version for o in await held(proc, "tri/y")] == [gone]
