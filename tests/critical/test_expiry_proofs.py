"""The proof a critical tombstone's expiry rests on (`SyncReplication.forgettable_deletes`)
against agents that answer `List` as told: the unit test of its reading of the answers.

The copy regions are fake agents (test scaffolding, a fake port) on loopback ports,
each answering a listing with the versions it is given, by the highest or the lowest
as asked, and saying so in `ListResponse.lowest` unless it plays an agent that predates
that flag; the owner is the real `SyncReplication` over a real store.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
from harness.fake_peers import serving
from placements import critical

from agents.replication.sync import SyncReplication
from agents.store import ObjectStore
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc

DS = "tri/proofs"
PLACEMENT = critical(DS, home="eu-central", replicas=("eu-west", "eu-north"))
PUT = Version.put(HLC(1_000, 0, "eu-central"), 1, Digest.of(b"x"))
GONE = Version.delete(HLC(2_000, 0, "eu-central"))


class ListingRegion(agent_pb2_grpc.AgentServicer):
    """A region's agents, as its routed listing merges them: `held` is each agent's
    newest version of the key (an empty list: nothing)."""

    def __init__(self, held: list[Version], *, echoes: bool = True) -> None:
        self.held = held
        self.echoes = echoes
        self.asked: list[bool] = []  # `lowest` of each listing asked

    async def List(  # noqa: N802 - the generated servicer's name
        self,
        request: agent_pb2.ListRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ListResponse:
        self.asked.append(request.lowest)
        objects = []
        if self.held:
            pick = min if request.lowest and self.echoes else max
            version = pick(self.held, key=lambda v: v.hlc)
            objects.append(
                agent_pb2.ObjectInfo(dataset=DS, key="k", version=version_to_wire(version))
            )
        return agent_pb2.ListResponse(objects=objects, lowest=request.lowest and self.echoes)


async def proof(tmp_path: Path, regions: dict[str, ListingRegion]) -> set[str]:
    async with contextlib.AsyncExitStack() as stack:
        store = stack.enter_context(ObjectStore(tmp_path, clock=HybridClock("eu-central")))
        peers = await stack.enter_async_context(serving(regions))
        sync = SyncReplication(store, "eu-central", peers, timeout_s=5, deltas=False)
        stack.push_async_callback(sync.close)
        return await sync.forgettable_deletes(DS, PLACEMENT, [("k", GONE.hlc.text)])


def everywhere(**special: ListingRegion) -> dict[str, ListingRegion]:
    regions = {r: ListingRegion([GONE]) for r in ("eu-central", "eu-west", "eu-north")}
    regions.update({r.replace("_", "-"): region for r, region in special.items()})
    return regions


async def test_the_delete_shown_everywhere_or_nothing_is_forgettable(tmp_path: Path) -> None:
    regions = everywhere(eu_north=ListingRegion([]))
    assert await proof(tmp_path, regions) == {"k"}
    # Each region asked twice: by the lowest and by the highest.
    assert all(sorted(r.asked) == [False, True] for r in regions.values())


async def test_an_agent_still_showing_the_put_keeps_it(tmp_path: Path) -> None:
    # eu-west's highest is the delete; one of its agents still shows the put.
    assert await proof(tmp_path, everywhere(eu_west=ListingRegion([GONE, PUT]))) == set()


async def test_a_newer_write_anywhere_keeps_it(tmp_path: Path) -> None:
    newer = Version.put(HLC(3_000, 0, "eu-central"), 1, Digest.of(b"y"))
    assert await proof(tmp_path, everywhere(eu_north=ListingRegion([newer, GONE]))) == set()


async def test_an_agent_that_predates_lowest_proves_nothing(tmp_path: Path) -> None:
    """It merges by the highest whatever it is asked: the delete, though one of its
    agents still shows the put. Without the echo, that answer would be read as the
    lowest."""
    stale = ListingRegion([GONE, PUT], echoes=False)
    assert await proof(tmp_path, everywhere(eu_west=stale)) == set()
