"""Delta pushes of critical writes against real agent processes and etcd (issue 13): a
new version of a large object reaches the replica as a delta over the version it
holds (the catalog's transfer record shows the wire bytes far below the logical
ones), and a replica that lost that basis gets it whole, still acked and bit-exact."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import grpc
import pytest
from critical_helpers import put, stat
from harness.agent_process import AgentProcess
from harness.cli_schema import check_output
from harness.controllers import run_cli
from waiting import until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from meridian.v1 import agent_pb2, agent_pb2_grpc

pytestmark = pytest.mark.integration

Agents = dict[str, AgentProcess]
MiB = 1 << 20


async def claim(coord: EtcdCoordination, dataset: str) -> None:
    epoch = await Ownership(coord).claim(
        dataset, "eu-west", expect_epoch=0, reason="home", actor="test"
    )
    assert epoch is not None


def edited(data: bytes, at: int, patch: bytes) -> bytes:
    return data[:at] + patch + data[at + len(patch) :]


async def transfer_to(
    env: dict[str, str], dataset: str, version: str, timeout_s: float = 30
) -> dict[str, object]:
    """The catalog's record of the copy of `version` into eu-central, once the agent's
    recorder has shipped it (polled, bounded)."""

    async def recorded() -> dict[str, object] | None:
        done = await asyncio.to_thread(
            run_cli, ["audit", "transfers", "--dataset", dataset, "-o", "json"], env
        )
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        check_output("audit_transfers", rows)
        found = [r for r in rows if r["version"] == version and r["to"] == "eu-central"]
        assert len(found) <= 1, found
        return dict(found[0]) if found else None

    what = f"a transfer of {dataset} at {version} to eu-central recorded"
    return await until(recorded, timeout_s, what=what, step_s=0.25)


async def test_a_new_version_goes_as_a_delta_and_whole_to_a_replica_without_its_basis(
    eu_agents: Agents, coord: EtcdCoordination, critical_world: dict[str, str]
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    dataset = "pair/delta"
    await claim(coord, dataset)
    first = os.urandom(4 * MiB)
    v1 = await put(west.address, dataset, "weights", first)
    assert list(v1.regions) == ["eu-west", "eu-central"]
    whole = await transfer_to(critical_world, dataset, v1.version.hlc)
    assert whole["logical_bytes"] == 4 * MiB
    assert whole["wire_bytes"] >= 4 * MiB  # nothing to diff against: pushed whole

    second = edited(first, 3 * MiB, b"a fine-tuned layer" * 1000)
    v2 = await put(west.address, dataset, "weights", second)
    assert list(v2.regions) == ["eu-west", "eu-central"]
    held = await stat(central.address, dataset, "weights")
    assert held is not None and held.version.digest == v2.version.digest
    delta = await transfer_to(critical_world, dataset, v2.version.hlc)
    assert delta["logical_bytes"] == 4 * MiB
    assert 0 < int(delta["wire_bytes"]) < MiB // 4, delta  # the changed bytes and framing

    # eu-central loses everything (a new disk): the owner's basis is not there any
    # more, so the next version goes whole (the replica says so at once), still acked
    # by both, still exact.
    assert central.stop() == 0
    shutil.rmtree(central.root)
    central.start(timeout_s=120)  # a loaded machine may take long to start one
    third = edited(second, MiB, b"another step" * 500)
    v3 = await put(west.address, dataset, "weights", third)
    assert list(v3.regions) == ["eu-west", "eu-central"]
    async with grpc.aio.insecure_channel(central.address) as channel:
        got = b"".join(
            [
                m.chunk
                async for m in agent_pb2_grpc.AgentStub(channel).Get(
                    agent_pb2.GetRequest(dataset=dataset, key="weights"), timeout=30
                )
                if m.WhichOneof("frame") == "chunk"
            ]
        )
    assert got == third
    again = await transfer_to(critical_world, dataset, v3.version.hlc)
    assert int(again["wire_bytes"]) >= 4 * MiB


async def test_a_replica_answers_basis_missing_before_reading_a_frame(
    eu_agents: Agents, coord: EtcdCoordination
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    dataset = "pair/nobasis"
    await claim(coord, dataset)
    v1 = await put(west.address, dataset, "k", os.urandom(256 * 1024))
    owner = await Ownership(coord).get(dataset)
    assert owner is not None

    async def frames() -> object:
        header = agent_pb2.ReplicateHeader(
            dataset=dataset,
            key="k",
            version=v1.version,
            epoch=owner.epoch,
            origin_region="eu-west",
            basis=agent_pb2.Basis(version="0000000000001.00000@eu-west", digest="blake3:00"),
        )
        yield agent_pb2.ReplicateRequest(header=header)
        yield agent_pb2.ReplicateRequest(delta=b"not a delta")

    async with grpc.aio.insecure_channel(central.address) as channel:
        resp = await agent_pb2_grpc.AgentStub(channel).Replicate(frames(), timeout=10)  # type: ignore[arg-type]
    assert resp.basis_missing
    assert resp.region == "eu-central"
