"""The switchover's catch-up wait asks the agents: `AgentCatchUpProbe` compares the
owner's and the target's listings by HLC and digest (real agent processes, etcd)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from critical_helpers import put, stat
from harness.agent_process import AgentProcess
from waiting import WaitTimeoutError, until

from agents.client import ObjectInfo
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.controller.agent_probe import AgentCatchUpProbe, lacking
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version

pytestmark = pytest.mark.integration


def _direct(_region: str, address: str) -> str:
    return address


async def test_the_probe_reports_what_the_target_agent_lacks(
    eu_agents: dict[str, AgentProcess], coord: EtcdCoordination, etcd_endpoint: str
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    await Ownership(coord).claim("tri/e", "eu-west", expect_epoch=0, reason="home", actor="t")
    probe = AgentCatchUpProbe([etcd_endpoint], _direct)
    await put(west.address, "tri/e", "k1", b"everywhere")
    assert await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-central") == []

    assert central.stop() == 0
    missed = await put(west.address, "tri/e", "k2", b"acked by eu-west and eu-north")
    assert sorted(missed.regions) == ["eu-north", "eu-west"]
    # The target down: not comparable, so not caught up (the wait goes on).
    down = await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-central")
    assert len(down) == 1 and "cannot be compared" in down[0]

    central.start()
    # The owner's catch-up pushes what eu-central missed; the probe then finds nothing.
    lacking: list[str] = []

    async def caught_up() -> bool:
        nonlocal lacking
        lacking = await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-central")
        if lacking:
            assert lacking == [f"k2@{missed.version.hlc}"] or "cannot be compared" in lacking[0]
        return not lacking

    with contextlib.suppress(WaitTimeoutError):  # the assertion says what it lacks
        await until(caught_up, 20, what="eu-central caught up", step_s=0.25)
    assert lacking == []
    held = await stat(central.address, "tri/e", "k2")
    assert held is not None and held.version.digest == missed.version.digest
    assert await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-north") == []


def test_lacking_compares_newest_versions_by_hlc_and_digest() -> None:
    def info(key: str, wall: int, digest: str) -> ObjectInfo:
        return ObjectInfo("d", key, Version.put(HLC(wall, 0, "eu-west"), 1, digest))

    d1, d2 = Digest("blake3", "1" * 64), Digest("blake3", "2" * 64)
    source = [info("a", 10, d1), info("b", 20, d1), info("c", 30, d1)]
    target = [info("a", 10, d1), info("b", 10, d1), info("c", 30, d2)]
    assert lacking(source, target) == [
        f"b@{HLC(20, 0, 'eu-west')}",
        f"c@{HLC(30, 0, 'eu-west')}",
    ]
    assert lacking(source, source) == []
