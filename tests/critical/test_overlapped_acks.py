"""The owner's ack of a write pushed while it commits (agents/replication/sync.py,
`CommittedWrite.local`), on faked pushes: the replicas' quorum is not enough, the ack
waits for the owner's own commit, and a failed commit fails the write."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from waiting import until

from agents.admission import Admitted
from agents.replication import SyncReplication
from agents.service.servicer import CommittedWrite
from agents.store import ObjectStore, StorageError
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version

PLACEMENT = Placement(
    dataset="ckpt/overlap",
    policy="checkpoints",
    dataset_class="critical",
    home="eu-west",
    replicas=("eu-central", "eu-north"),
    residency=("EU",),
    rpo_s=0,
    failover_mode="automatic",
    failover_order=("eu-central", "eu-north"),
)


class NoPeers:
    async def address(self, region: str) -> str:
        raise AssertionError(f"no call to {region} here: the pushes are faked")

    def forget(self, region: str) -> None:
        pass


def replication(store: ObjectStore, pushed: list[str]) -> SyncReplication:
    sync = SyncReplication(store, "eu-west", NoPeers(), batch_max=1)

    async def push(region: str, _w: CommittedWrite, _v: Version, _deadline: float) -> str:
        pushed.append(region)
        return region

    sync._push = push  # type: ignore[method-assign]
    sync._reconciled[PLACEMENT.dataset] = 5  # no takeover pass: this epoch began earlier
    return sync


def write(local: asyncio.Future[Version]) -> CommittedWrite:
    version = Version(HybridClock("eu-west").now(), "delete", 0, None)
    return CommittedWrite(
        Admitted(PLACEMENT, 5, 1), PLACEMENT.dataset, key="k", version=version, local=local
    )


async def test_the_ack_waits_for_the_owners_own_commit(tmp_path: Path) -> None:
    pushed: list[str] = []
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = replication(store, pushed)
        local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
        w = write(local)
        acking = asyncio.create_task(sync.replicate(w))
        await until(lambda: len(pushed) == 2, 5, "both pushes")
        # Both replicas hold it (a quorum without the owner), but the owner's copy
        # is not durable yet: no ack (a bounded look: nothing is to happen).
        done, _ = await asyncio.wait({acking}, timeout=0.2)
        assert sorted(pushed) == ["eu-central", "eu-north"] and not done
        assert w.version is not None
        local.set_result(w.version)
        regions = await asyncio.wait_for(acking, timeout=5)
        assert regions[0] == "eu-west" and len(regions) >= 2
        await sync.close()


async def test_a_failed_own_commit_fails_the_write_whatever_the_replicas_hold(
    tmp_path: Path,
) -> None:
    pushed: list[str] = []
    with ObjectStore(tmp_path / "s", clock=HybridClock("eu-west")) as store:
        sync = replication(store, pushed)
        local: asyncio.Future[Version] = asyncio.get_running_loop().create_future()
        local.set_exception(StorageError("the disk is gone (test)"))
        with pytest.raises(StorageError, match="the disk is gone"):
            await asyncio.wait_for(sync.replicate(write(local)), timeout=5)
        await sync.close()
