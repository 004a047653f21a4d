"""The daemon's parts on their own, against the stack's real etcd: the registration on a
lease, the watched owners feeding the fence, the root's identity."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from waiting import until

from agents.daemon.identity import IDENTITY_FILE, check_writable, load_or_create
from agents.daemon.owners import OwnershipWatch
from agents.daemon.registration import AgentRecord, Registration
from agents.store.model import Usage
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.errors import ConfigError
from controlplane.ports.coordination import KeyValue

pytestmark = pytest.mark.integration


def record(agent_id: str = "eu-west-a1") -> AgentRecord:
    return AgentRecord(agent_id, "eu-west", "127.0.0.1:1234", 2, "2026-12-01T00:00:00Z")


async def test_registration_lives_on_its_lease_and_goes_with_stop(
    coord: EtcdCoordination,
) -> None:
    usage = {"now": Usage(objects=1, versions=1, bytes=10, bytes_free=90)}
    reg = Registration(coord, record(), lambda: usage["now"], lease_ttl_s=5, usage_interval_s=0.1)
    await reg.start()
    try:
        kv = await coord.get(keys.agent("eu-west", "eu-west-a1"))
        assert kv is not None and kv.lease == reg.lease_id != 0
        doc = json.loads(kv.value)
        assert doc == {
            "id": "eu-west-a1",
            "region": "eu-west",
            "endpoint": "127.0.0.1:1234",
            "weight": 2,
            "started_at": "2026-12-01T00:00:00Z",
            "objects": 1,
            "bytes": 10,
            "capacity_bytes": 100,
        }
        # Usage figures follow the store, under the same lease.
        usage["now"] = Usage(objects=3, versions=3, bytes=30, bytes_free=70)

        async def updated() -> KeyValue | None:
            kv = await coord.get(keys.agent("eu-west", "eu-west-a1"))
            return kv if kv is not None and json.loads(kv.value)["objects"] == 3 else None

        kv = await until(updated, 5, what="the registration to show 3 objects")
        assert kv is not None and json.loads(kv.value)["objects"] == 3
        assert kv.lease == reg.lease_id
    finally:
        await reg.stop()
    assert await coord.get(keys.agent("eu-west", "eu-west-a1")) is None


async def test_a_lost_lease_is_replaced_by_a_new_registration(coord: EtcdCoordination) -> None:
    reg = Registration(
        coord,
        record(),
        lambda: Usage(0, 0, 0, 0),
        lease_ttl_s=2,
        usage_interval_s=0.1,
        retry_initial_s=0.05,
    )
    await reg.start()
    try:
        first = reg.lease_id
        await coord.revoke(first)  # as etcd expiring it would: the key goes

        async def again() -> KeyValue | None:
            kv = await coord.get(keys.agent("eu-west", "eu-west-a1"))
            # Both: the key is visible before the registration's put has returned.
            return kv if kv is not None and kv.lease != first and reg.registrations == 2 else None

        kv = await until(again, 10, what="a registration under a new lease")
        assert kv is not None and kv.lease not in (0, first)
        assert reg.registrations == 2
    finally:
        await reg.stop()


async def test_the_owners_watch_follows_claims_and_handovers_into_the_fence(
    coord: EtcdCoordination,
) -> None:
    own = Ownership(coord)
    epoch1 = await own.claim("ckpt/a", "eu-west", expect_epoch=0, reason="home", actor="t")
    fence = FencedResource()
    watch = OwnershipWatch(coord, fence, retry_initial_s=0.05)
    await watch.start()
    try:
        found = watch.owner("ckpt/a")
        assert found is not None and (found.region, found.epoch) == ("eu-west", epoch1)
        assert watch.owner("ckpt/none") is None
        assert fence.highest_epoch("ckpt/a") == epoch1

        owner = await own.get("ckpt/a")
        assert owner is not None
        mark = await own.begin_handover("ckpt/a", owner, "eu-central", "t")
        await watch.wait_for_revision(mark.create_revision, timeout_s=10)
        frozen = watch.owner("ckpt/a")
        assert frozen is not None and frozen.handing_over_to == "eu-central"
        with pytest.raises(DatasetHandingOverError):
            fence.admit("ckpt/a", epoch1)

        await coord.put(keys.alive("eu-central"), b"{}")  # a move needs a live target
        epoch2 = await own.complete_handover(mark, reason="switchover", actor="t")
        await watch.wait_for_revision(epoch2, timeout_s=10)
        moved = watch.owner("ckpt/a")
        assert moved is not None
        assert (moved.region, moved.epoch, moved.handing_over_to) == ("eu-central", epoch2, None)
        with pytest.raises(StaleEpochError):
            fence.admit("ckpt/a", epoch1)
        assert fence.admit("ckpt/a", epoch2) == epoch2
    finally:
        await watch.stop()


def test_the_identity_is_kept_in_the_root_and_tied_to_its_region(tmp_path: Path) -> None:
    root = tmp_path / "root"
    check_writable(root)
    first = load_or_create(root, "eu-west")
    assert first.agent_id.startswith("eu-west-")
    assert load_or_create(root, "eu-west") == first
    assert json.loads((root / IDENTITY_FILE).read_text())["id"] == first.agent_id
    assert os.listdir(root) == [IDENTITY_FILE]  # the probe and the temporary are gone
    with pytest.raises(ConfigError, match="belongs to region eu-west"):
        load_or_create(root, "us-east")
    (root / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="is not an agent identity"):
        load_or_create(root, "eu-west")


def test_a_root_that_cannot_be_written_is_refused_in_one_sentence(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot be created"):
        check_writable(blocker / "root")
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    # Root ignores permission bits; an immutable folder refuses even root.
    subprocess.run(["chattr", "+i", str(frozen)], check=True)
    try:
        with pytest.raises(ConfigError, match=f"the store root {frozen} is not writable"):
            check_writable(frozen)
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
    assert not [n for n in os.listdir(frozen) if n.startswith(".write-probe")]
