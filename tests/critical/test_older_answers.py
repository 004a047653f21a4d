"""A replica's "older" answer counts toward an ack only over a version the owner knows
(agents/replication/sync.py, `_check_newer`), on real agent processes and a real etcd.

eu-west holds a newer version of the key than the owner's write: another owner's
write the new owner (eu-central, its clock behind) does not hold, such as a deposed
owner's lone one. It answers the push "older". Counted, the write was acked with
eu-west as its second copy, while eu-west holds something else; once that lone write
is rewound (by its own owner, or a takeover pass) the acked write is on one region
only. Not counted, the write needs eu-north, which is down: it is refused,
retriable, and nothing is acked on a copy that is not there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from critical_helpers import kill_all, put, stat, wait_ready
from harness.agent_process import AgentProcess
from harness.raw_replicate import replicate_raw
from waiting import until

from agents.store import ObjectStore
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HybridClock
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2

pytestmark = pytest.mark.integration

DS = "tri/older"
REGIONS = ("eu-west", "eu-central", "eu-north")


@pytest.fixture
def agents(tmp_path: Path, critical_world: dict[str, str]) -> Iterator[dict[str, AgentProcess]]:
    procs: dict[str, AgentProcess] = {}
    try:
        for region in REGIONS:
            env = dict(critical_world)
            if region == "eu-central":
                env["MERIDIAN_CLOCK_OFFSET_MS"] = "-5000"  # the new owner's clock is behind
            procs[region] = AgentProcess(region, tmp_path / region, env, tmp_path / f"{region}.log")
            procs[region].spawn()
        wait_ready(procs.values())
        yield procs
    finally:
        kill_all(procs.values())


def passes_done(proc: AgentProcess) -> set[str]:
    done: set[str] = set()
    for line in proc.log_text().splitlines():
        if '"takeover_pass_done"' in line:
            with contextlib.suppress(ValueError):
                done.add(str(json.loads(line).get("region")))
    return done


async def test_an_older_answer_over_a_version_the_owner_lacks_is_not_counted(
    agents: dict[str, AgentProcess], coord: EtcdCoordination, tmp_path: Path
) -> None:
    west, central, north = (agents[r] for r in REGIONS)
    epoch = await Ownership(coord).claim(
        DS, "eu-central", expect_epoch=0, reason="failover", actor="test"
    )
    # Its takeover passes are over before eu-west is given the other write (a pass
    # would judge it: this test is about the pushes after).
    await until(lambda: passes_done(central) >= {"eu-west", "eu-north"}, 30, "eu-central's passes")
    assert north.stop() == 0
    # Another owner's write of each key, on eu-west alone, newer than what eu-central
    # writes next: a small write's push goes batched (ReplicatePushes), a larger alone.
    sizes = {"small": 1024, "large": 128 * 1024}
    source = ObjectStore(tmp_path / "source", clock=HybridClock("eu-west"))
    try:
        others = {key: source.put(DS, key, [b"another owner's write"]) for key in sizes}
    finally:
        source.close()
    for key, other in others.items():
        header = agent_pb2.ReplicateHeader(
            dataset=DS,
            key=key,
            version=version_to_wire(other),
            epoch=epoch,
            origin_region="eu-central",
        )
        await replicate_raw(west.address, header, [b"another owner's write"])

    for key, size in sizes.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await put(central.address, DS, key, b"y" * size, timeout_s=20)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, key  # retriable
        assert "eu-north" in (refused.value.details() or ""), key
        held = await stat(west.address, DS, key)
        assert held is not None and held.version.hlc == others[key].hlc.text  # never ours
