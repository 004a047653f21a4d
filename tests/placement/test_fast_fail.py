"""Fast failure detection inside a region of real agents (agents/placement/fastfail.py):
a SIGKILLed agent's registration goes long before its lease would lapse, once both its
watchers agree; a SIGSTOPped
one (its port still accepts, nothing answers) keeps it until the lease lapses; and a
late report about a killed agent never removes the agent restarted on its address."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator

import pytest
import waiting
from harness.agent_process import AgentProcess
from region_harness import RegionOfAgents

from agents.placement import MembershipWatch
from agents.placement.fastfail import FastFailDetector, Probe, probe
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys

pytestmark = pytest.mark.integration

# How soon a SIGKILLed agent's registration goes, against a lease that lapses in 20 s or
# more: "long before", with room for a loaded 2-core machine.
FAST_S = 8.0


@pytest.fixture
async def coord(etcd_endpoint: str) -> AsyncIterator[EtcdCoordination]:
    found = EtcdCoordination([etcd_endpoint], timeout_s=5.0)
    await found.connect()
    try:
        yield found
    finally:
        await found.close()


async def leases(coord: EtcdCoordination, region: str) -> dict[str, int]:
    """Agent id -> the lease its registration is on."""
    kvs, _ = await coord.get_prefix(keys.agents_of(region))
    return {str(json.loads(kv.value)["id"]): kv.lease for kv in kvs}


def events_about(region: RegionOfAgents, name: str, agent_id: str) -> list[dict[str, object]]:
    return [
        e
        for proc in region.live()
        for e in proc.events()
        if e.get("event") == name and e.get("agent") == agent_id
    ]


async def watched(region: RegionOfAgents, victim: AgentProcess, watchers: int = 2) -> None:
    """Until `watchers` live peers each hold a health watch on `victim` that saw it
    SERVING. A watcher that had not yet seen it would not vote it down, so fewer than
    both would leave the agreement to chance (a CI run lost that race once)."""
    victim_id = region.agent_id(victim)

    def watching() -> bool:
        return (
            sum(
                any(
                    e.get("event") == "peer_watched" and e.get("agent") == victim_id
                    for e in proc.events()
                )
                for proc in region.live()
            )
            >= watchers
        )

    await waiting.until(watching, 30, f"{watchers} peers watching {victim_id}", step_s=0.1)


async def test_a_killed_agent_is_marked_down_long_before_its_lease_lapses(
    region: RegionOfAgents, coord: EtcdCoordination
) -> None:
    # A lapse would take 20 s or more after the kill (renewed every TTL / 3), and the
    # agreement takes about 0.3 s on a quiet machine: the bound leaves a loaded one
    # 25 times that, and still fails when only the lease removes it.
    region.lease_ttl_s = 30
    region.add(3)
    await region.wait_members(3)
    victim = region.agents[2]
    victim_id = region.agent_id(victim)
    await watched(region, victim)
    killed = time.monotonic()
    victim.kill()
    await waiting.until(
        lambda: _absent(coord, region.region, victim_id),
        FAST_S,
        f"the registration of {victim_id} to go",
        step_s=0.05,
    )
    assert time.monotonic() - killed < FAST_S
    # The voter logs its verdict once etcd has answered the revoke, which may be after
    # the key is seen gone here: await the line rather than read the logs at once.
    marked = await waiting.until(
        lambda: events_about(region, "peer_marked_down", victim_id),
        10,
        "a peer to log that it marked the victim down",
        detail=lambda: [p.log_tail(5) for p in region.live()],
    )
    assert all(e["reason"] == "connection refused, confirmed" for e in marked)
    # Both of its watchers voted it down before it was marked (fastfail.py, agreement).
    agreed = events_about(region, "peer_down_agreed", victim_id)
    assert agreed and all(len(e["voters"]) == 2 for e in agreed), agreed
    assert set(await leases(coord, region.region)) == {region.agent_id(p) for p in region.live()}


async def _absent(coord: EtcdCoordination, region: str, agent_id: str) -> bool:
    return agent_id not in await leases(coord, region)


async def test_a_paused_agent_keeps_its_registration_until_its_lease_lapses(
    region: RegionOfAgents, coord: EtcdCoordination
) -> None:
    region.lease_ttl_s = 5  # renewed every 1.7 s: it lapses 3-5 s after the pause
    region.add(3)
    await region.wait_members(3)
    victim = region.agents[2]
    victim_id = region.agent_id(victim)
    await watched(region, victim)
    watch = MembershipWatch(coord, region.region)
    async with watch:
        detector = FastFailDetector(coord, watch, "the-test", confirm_after_s=0.05)
        victim.signal(signal.SIGSTOP)
        paused = time.monotonic()
        try:
            # What its lease had left when it stopped renewing (etcd's whole seconds,
            # rounded down; asked after the pause, so no more than it had then). Judged
            # against this, not the nominal TTL: on a loaded machine its last renewal
            # may have come late, and the lease lapse early.
            lease = (await leases(coord, region.region))[victim_id]
            left_s = await coord.lease_ttl(lease)
            # Its kernel still accepts connections: no refusal, hence no verdict.
            assert await probe(victim.address) is Probe.ANSWERED
            assert not await detector.report(victim_id)
            assert detector.marked_down == []
            assert victim_id in await leases(coord, region.region)
            await waiting.until(
                lambda: _absent(coord, region.region, victim_id),
                region.lease_ttl_s + 15,
                f"the lease of {victim_id} to lapse",
                step_s=0.05,
            )
            gone_after = time.monotonic() - paused
        finally:
            victim.signal(signal.SIGCONT)
    # The lease decided: the registration stayed as long as its lease had left.
    assert gone_after >= left_s - 0.2, (gone_after, left_s)
    assert events_about(region, "peer_marked_down", victim_id) == []


async def test_a_late_report_never_removes_the_agent_restarted_on_the_address(
    region: RegionOfAgents, coord: EtcdCoordination
) -> None:
    region.lease_ttl_s = 10
    region.add(2, fixed_port=True)
    await region.wait_members(2)
    victim = region.agents[1]
    victim_id = region.agent_id(victim)
    address = victim.address
    # A detector whose view is frozen with the first registration: a report that
    # comes late, after the agent was restarted on the same address.
    watch = MembershipWatch(coord, region.region)
    async with watch:
        stale = watch.current.get(victim_id)
        assert stale is not None and stale.lease
        detector = FastFailDetector(coord, watch, "the-test")
    # Its one peer watches the first registration before the kill, so that peer logs
    # `peer_watched` once for each registration below (a CI run killed it first: one).
    await watched(region, victim, watchers=1)
    victim.kill()
    await waiting.until(  # its one watcher marks it down, or else its lease lapses
        lambda: _absent(coord, region.region, victim_id),
        region.lease_ttl_s + 10,
        "the first registration to go",
    )
    victim.start()
    assert victim.address == address
    await waiting.until(
        lambda: _registered_anew(coord, region.region, victim_id, stale.lease),
        30,
        "the restarted agent's registration",
    )
    assert await detector.mark_down(victim_id, stale.lease, endpoint=address)
    assert detector.marked_down  # the stale view let it act: the lease decides
    now = await leases(coord, region.region)
    assert victim_id in now and now[victim_id] != stale.lease
    # The surviving peer watches the successor and leaves it registered.
    await waiting.until(
        lambda: len(events_about(region, "peer_watched", victim_id)) >= 2,
        30,
        "a peer watching the restarted agent",
    )
    assert victim_id in await leases(coord, region.region)


async def _registered_anew(coord: EtcdCoordination, region: str, agent_id: str, old: int) -> bool:
    lease = (await leases(coord, region)).get(agent_id)
    return lease is not None and lease != old
