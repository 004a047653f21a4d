"""A pushed critical copy is registered between its owner read and the end of its commit
(agents/admission.py, *A new owner's listing*), on every receive path: `Replicate` of a
put and of a delete, and `ReplicateSet`. A call cancelled while its commit runs (its
deadline, the server stopping) stays registered until the commit has ended
(agents/to_the_end.py): a listing never misses a copy that lands a moment later.

The store's commit is held on a threading event, so the test decides when it ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from agents_inproc import AgentFactory
from waiting import until

from agents.replication import replica_sets
from agents.transfer.pull import CHANNEL_OPTIONS
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest, Version
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

EPOCH = 5
WAIT_S = 10.0
WINDOW_S = 0.2  # the listing must still wait: an absence, which no event announces


class HeldCommit:
    """Wraps a store call run in a thread: it signals when entered and runs on only
    once the test releases it."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        if not self.release.wait(WAIT_S * 2):
            raise AssertionError("the test never released the commit")
        return self.real(*args, **kwargs)


def version(ms: int, data: bytes | None) -> Version:
    hlc = HLC(1_764_579_120_000 + ms, 0, "eu-west")
    return Version.delete(hlc) if data is None else Version.put(hlc, len(data), Digest.of(data))


@pytest.mark.parametrize("cancelled", [False, True], ids=["answered", "cancelled"])
@pytest.mark.parametrize("kind", ["put", "delete"])
async def test_a_replicate_holds_a_listing_until_its_commit_ends(
    agents: AgentFactory, monkeypatch: pytest.MonkeyPatch, kind: str, cancelled: bool
) -> None:
    central = await agents("eu-central")
    central.owners.set("crit", "eu-west", EPOCH)
    data = None if kind == "delete" else b"one shard"
    pushed = version(1, data)
    store_call = "apply" if data is None else "commit_apply"
    held = HeldCommit(getattr(central.store, store_call))
    monkeypatch.setattr(central.store, store_call, held)
    header = agent_pb2.ReplicateHeader(
        dataset="crit",
        key="k",
        version=version_to_wire(pushed),
        epoch=EPOCH,
        origin_region="eu-west",
    )

    async def frames() -> Any:
        yield agent_pb2.ReplicateRequest(header=header)
        if data is not None:
            yield agent_pb2.ReplicateRequest(chunk=data)

    async with grpc.aio.insecure_channel(central.address, options=CHANNEL_OPTIONS) as channel:
        call = agent_pb2_grpc.AgentStub(channel).Replicate(frames(), timeout=WAIT_S * 3)
        try:
            await until(held.entered.is_set, WAIT_S, "the commit is running")
            listing = asyncio.create_task(central.admission.received("crit"))
            if cancelled:
                call.cancel()
            await asyncio.sleep(WINDOW_S)
            assert not listing.done(), "the listing went ahead of a commit still running"
            held.release.set()
            await asyncio.wait_for(listing, WAIT_S)
            # By the time the listing goes, the copy is in the store.
            assert central.store.head("crit", "k") == pushed
            if cancelled:
                with pytest.raises(asyncio.CancelledError):
                    await call
            else:
                assert (await call).region == "eu-central"
        finally:
            held.release.set()


async def test_a_replicate_set_holds_a_listing_until_its_commit_ends(
    agents: AgentFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    central = await agents("eu-central")
    central.owners.set("crit", "eu-west", EPOCH)
    held = HeldCommit(replica_sets._apply_all)
    monkeypatch.setattr(replica_sets, "_apply_all", held)
    member = version(1, b"member")
    request = agent_pb2.ReplicateSetRequest(
        sets=[
            types_pb2.VersionSet(
                dataset="crit",
                id="s1",
                members=[types_pb2.SetMember(key="m1", version=member.hlc.text)],
                hlc=HLC(member.hlc.wall_ms, 1, "eu-west").text,
            )
        ],
        epoch=EPOCH,
        origin_region="eu-west",
    )
    call = asyncio.create_task(
        replica_sets.receive_sets(central.store, central.admission, "eu-central", request)
    )
    try:
        await until(held.entered.is_set, WAIT_S, "the set's commit is running")
        listing = asyncio.create_task(central.admission.received("crit"))
        call.cancel()
        await asyncio.sleep(WINDOW_S)
        assert not listing.done(), "the listing went ahead of a set's commit still running"
        held.release.set()
        await asyncio.wait_for(listing, WAIT_S)
        # Recorded by then (its member not yet stored here).
        assert list(central.store.missing_members("crit", "s1")) == ["m1"]
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        held.release.set()
