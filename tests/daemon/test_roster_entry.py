"""An agent's own roster entry (agents/placement/roster.py) against the stack's real
etcd: a returning agent keeps the smaller count it vouched for, every registration
(a lost lease's too) rewrites an entry a survivor's clear deleted while the agent was
unregistered, and a settled raise never goes above the count the region has now; a
registration's hook is bounded by half the lease's TTL."""

from __future__ import annotations

import asyncio
import json

import pytest
from waiting import until

from agents.daemon.registration import AgentRecord, Registration
from agents.placement.departures import roster_key
from agents.placement.roster import Roster
from agents.store.model import Usage
from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols import keys
from controlplane.errors import UnavailableError

pytestmark = pytest.mark.integration

REGION, AGENT = "eu-west", "eu-west-a1"
KEY = roster_key(REGION, AGENT)


async def copies(coord: EtcdCoordination) -> int | None:
    kv = await coord.get(KEY)
    return None if kv is None else int(json.loads(kv.value)["copies"])


def registration(coord: EtcdCoordination) -> Registration:
    """AGENT's registration on a 2 s lease, retried fast."""
    return Registration(
        coord,
        AgentRecord(AGENT, REGION, "127.0.0.1:1234", 1, "2026-12-01T00:00:00Z"),
        lambda: Usage(0, 0, 0, 0),
        lease_ttl_s=2,
        usage_interval_s=0.1,
        retry_initial_s=0.05,
    )


async def test_a_returning_agent_keeps_the_smaller_count(coord: EtcdCoordination) -> None:
    await Roster(coord, REGION, AGENT).write(1, "127.0.0.1:1234")
    # Restarted where the region now has room for 2: what it holds was placed under 1.
    await Roster(coord, REGION, AGENT).write(2, "127.0.0.1:1234")
    assert await copies(coord) == 1
    await coord.delete(KEY)
    await Roster(coord, REGION, AGENT).write(2, "127.0.0.1:1234")  # a new agent: its own
    assert await copies(coord) == 2
    # An entry that does not parse reads as 1 copy (as departures.entries_from reads it).
    await coord.put(KEY, b"not json")
    await Roster(coord, REGION, AGENT).write(2, "127.0.0.1:1234")
    assert await copies(coord) == 1


async def test_every_registration_rewrites_an_entry_cleared_meanwhile(
    coord: EtcdCoordination,
) -> None:
    roster = Roster(coord, REGION, AGENT)
    await roster.write(2, "127.0.0.1:1234")
    reg = registration(coord)
    reg.on_registered = roster.restore
    # A survivor's settled clear in the gap between the entry and the registration.
    await coord.delete(KEY)
    await reg.start()
    try:
        assert await copies(coord) == 2
        # The lease is lost, and a clear deletes the entry before the agent is back.
        first = reg.lease_id
        await coord.delete(KEY)
        await coord.revoke(first)

        async def back() -> bool:
            return reg.registrations == 2 and await copies(coord) == 2

        await until(back, 10, what="a new registration with the entry rewritten")
    finally:
        await reg.stop()


async def test_a_settled_raise_stops_at_the_count_the_region_has_now(
    coord: EtcdCoordination,
) -> None:
    roster = Roster(coord, REGION, AGENT)
    await roster.write(1, "127.0.0.1:1234")
    # The pass settled under r=2, but an agent left since: the region has 1 now.
    await roster.settled_at(2, lambda: 1)
    assert await copies(coord) == 1
    await roster.settled_at(2, lambda: 2)
    assert await copies(coord) == 2
    await roster.see_copies(1)
    assert await copies(coord) == 1


async def test_a_hook_that_hangs_fails_the_registration_within_half_the_ttl(
    coord: EtcdCoordination,
) -> None:
    """The keepalive starts after the hook: a hook that never ends (etcd slow for the
    roster) must not outlive the new lease. The registration fails retriable, its lease
    revoked."""
    reg = registration(coord)

    async def hangs() -> None:
        await asyncio.Event().wait()

    reg.on_registered = hangs
    async with asyncio.timeout(10):  # a hook without its bound would hang here
        with pytest.raises(UnavailableError, match=r"within 1\.0 s"):
            await reg.start()
    assert await coord.get(keys.agent(REGION, AGENT)) is None  # its lease was revoked


async def test_a_settled_raise_never_undoes_the_lowering_for_a_set(
    coord: EtcdCoordination,
) -> None:
    """A pass that read the store just before a set landed settles after the lowering
    (queued behind it, as CI saw): the entry stays at 1 copy."""
    roster = Roster(coord, REGION, AGENT)
    await roster.write(2, "127.0.0.1:1234")
    await roster.holding_sets()
    assert await copies(coord) == 1
    await roster.settled_at(2, lambda: 2)
    assert await copies(coord) == 1
