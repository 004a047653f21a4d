"""The switchover's catch-up wait asks the agents: `AgentCatchUpProbe` compares the
owner's and the target's listings by HLC and digest (real agent processes, etcd)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from critical_helpers import put, stat, wait_stat_digest
from harness.agent_process import AgentProcess
from harness.controllers import run_cli
from waiting import WaitTimeoutError, until

from agents.client import ObjectInfo
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.catalog.api import open_catalog
from controlplane.controller.agent_probe import AgentCatchUpProbe, lacking, lacking_required
from controlplane.coordination.protocols import keys
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from controlplane.policy.placer import place

pytestmark = pytest.mark.integration


def _direct(_region: str, address: str) -> str:
    return address


async def test_the_probe_reports_what_the_target_agent_lacks(
    eu_agents: dict[str, AgentProcess], coord: EtcdCoordination, etcd_endpoint: str
) -> None:
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    await Ownership(coord).claim("tri/e", "eu-west", expect_epoch=0, reason="home", actor="t")
    probe = AgentCatchUpProbe([etcd_endpoint], _direct)
    k1 = await put(west.address, "tri/e", "k1", b"everywhere")
    # ack: quorum may answer before the push to eu-central lands.
    assert await wait_stat_digest(central.address, "tri/e", "k1", k1.version.digest, 30)
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
        # Bounded, not slept: the catch-up retries every few seconds at most (backoff),
        # and a restart under a loaded CI machine takes several.
        await until(caught_up, 45, what="eu-central caught up", step_s=0.25)
    assert lacking == []
    held = await stat(central.address, "tri/e", "k2")
    assert held is not None and held.version.digest == missed.version.digest
    assert await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-north") == []


async def test_a_cli_switchover_does_not_wait_for_a_version_only_the_owner_holds(
    eu_agents: dict[str, AgentProcess],
    coord: EtcdCoordination,
    critical_world: dict[str, str],
) -> None:
    """`meridian switchover` waits as the controller does (the agents decide), not for
    the catalog's newest version of each object: the catalog also lists a write the
    owner stored but never acked (admitted just before the handover mark, its pushes
    refused by the mark), which cannot reach the target while the mark holds, so the
    catalog alone made the switchover wait out its timeout and abort."""
    west = eu_agents["eu-west"]
    await Ownership(coord).claim("tri/e", "eu-west", expect_epoch=0, reason="home", actor="t")
    acked = await put(west.address, "tri/e", "k1", b"acked")
    await coord.put(keys.alive("eu-central"), b"{}")  # a move needs a live target
    # The catalog's record of such an unacked write: a newer k1, only at its origin.
    unacked = HLC.parse(acked.version.hlc)
    newer = HLC(unacked.wall_ms + 1000, 0, "eu-west")
    catalog = open_catalog(critical_world["MERIDIAN_CATALOG"], placer=place)
    try:
        catalog.register_version(
            "tri/e", "k1", newer.text, acked.version.digest, origin_region="eu-west"
        )
        assert [v.version for v in catalog.incomplete_versions("tri/e", "eu-central")] == [
            newer.text
        ]
    finally:
        catalog.close()

    switch = ["switchover", "--dataset", "tri/e", "--to", "eu-central", "--yes"]
    done = await asyncio.to_thread(run_cli, [*switch, "--timeout", "10"], critical_world)
    assert done.returncode == 0, done.stderr
    owner = await Ownership(coord).get("tri/e")
    assert owner is not None and owner.region == "eu-central", owner
    # The acked version was on the target before the move (zero RPO).
    held = await stat(eu_agents["eu-central"].address, "tri/e", "k1")
    assert held is not None and held.version.digest == acked.version.digest


async def test_an_owner_region_whose_agents_are_gone_is_not_caught_up(
    eu_agents: dict[str, AgentProcess], coord: EtcdCoordination, etcd_endpoint: str
) -> None:
    """The owner's agent stopped (its registration gone with it) while the target has
    agents: its last acked versions cannot be listed, and the catalog may not know
    them yet, so the probe says "not caught up" rather than ask the catalog."""
    west, central = eu_agents["eu-west"], eu_agents["eu-central"]
    await Ownership(coord).claim("tri/e", "eu-west", expect_epoch=0, reason="home", actor="t")
    k1 = await put(west.address, "tri/e", "k1", b"everywhere")
    assert await wait_stat_digest(central.address, "tri/e", "k1", k1.version.digest, 30)

    class CatalogSaysDone:
        def incomplete_versions(self, dataset: str, region: str) -> list[str]:
            return []

    probe = AgentCatchUpProbe([etcd_endpoint], _direct, CatalogSaysDone())
    assert await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-central") == []
    assert west.stop() == 0
    assert not (await coord.get_prefix(keys.agents_of("eu-west")))[0]
    lacking = await asyncio.to_thread(probe.incomplete_versions, "tri/e", "eu-central")
    assert len(lacking) == 1 and "eu-west has no agent registered" in lacking[0]


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
    # A copy whose bytes startup repair found gone is not held.
    lost = [ObjectInfo("d", "a", source[0].version, missing=True), *source[1:]]
    assert lacking(source, lost) == [f"a@{HLC(10, 0, 'eu-west')}"]
    # A delete: lacking where the target still shows the put; where it has nothing of
    # the object, only unless it is `forgotten` (no region shows an older version).
    gone = ObjectInfo("d", "a", Version.delete(HLC(40, 0, "eu-west")))
    assert lacking([gone], target, {"a"}) == [f"a@{HLC(40, 0, 'eu-west')}"]
    assert lacking([gone], [], {"a"}) == []
    assert lacking([gone], []) == [f"a@{HLC(40, 0, 'eu-west')}"]


def test_a_forgotten_delete_is_judged_against_the_required_version() -> None:
    """The target forgot an expired delete that quorum requires; a lone newer write on
    the owner does not make it lacking (the delete is still the required version), but
    a region still showing an older put does (a takeover there could adopt it)."""

    def at(wall: int) -> HLC:
        return HLC(wall, 0, "eu-west")

    d1 = Digest("blake3", "1" * 64)
    lone = [ObjectInfo("d", "k", Version.put(at(50), 1, d1))]
    gone = [ObjectInfo("d", "k", Version.delete(at(40)))]
    older = [ObjectInfo("d", "k", Version.put(at(30), 1, d1))]
    assert lacking_required([lone, [], gone], [], 2) == []
    assert lacking_required([lone, [], gone, older], [], 2) == [f"k@{at(40)}"]
    # Where the delete is not required (only one region holds it), nothing is lacking.
    assert lacking_required([gone, []], [], 2) == []
