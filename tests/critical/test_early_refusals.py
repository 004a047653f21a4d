"""The owner's push recovers a replica's early refusal that grpc aio reported as
INTERNAL "Internal error from Core" (grpc/grpc#36066; agents/replication/early_status.py):
asked again with the header alone (a few times while the bug hides that too), a stale
epoch is a fence (the deposed owner's
write fails for good, and it rewinds its copy), a handover is retriable, and a header
the replica admits now is a retriable error, never a commit. Hidden on every ask, the
fence is read from etcd (a fake `owner_now`): another owner or a newer epoch there
fences the write as the replica's answer would have; this region at the write's epoch,
no owner, or an etcd that cannot answer leave it retriable.

A unit test: the replicas are a fake agent (test scaffolding, a fake port) on loopback
ports that end a push still sending with the bug's INTERNAL and answer a header alone
with the refusal; the owner is the real `SyncReplication` over a real store. The bug
itself cannot be made to happen on demand against a real agent; the raw pushes of the
integration tests (tests/harness/raw_replicate.py) go through the same `header_alone`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import NamedTuple, Protocol

import grpc
import pytest
from harness.fake_peers import serving
from placements import critical
from waiting import until

from agents.admission import Admitted, OwnerRecord
from agents.client import CORE_INTERNAL
from agents.replication.sync import SyncReplication
from agents.rpc.status import abort
from agents.service import CommittedWrite
from agents.store import CHUNK_BYTES, ObjectStore, ShortStreamError
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.domain.hlc import HybridClock
from controlplane.errors import FencedError, MeridianError, UnavailableError
from meridian.v1 import agent_pb2, agent_pb2_grpc

DS = "tri/early"
PLACEMENT = critical(DS, home="eu-central", replicas=("eu-west", "eu-north"))
STALE = "epoch 3 is older than 4"  # the replicas' fence of the write (admitted at 3)

OwnerNow = Callable[[str], Awaitable[OwnerRecord | None]]


class GlitchingReplica(agent_pb2_grpc.AgentServicer):
    """A replica's Replicate (a fake port): a push with chunks ends with the bug's
    INTERNAL; a header alone gets `verdict` (an error raised, or a response)."""

    def __init__(self, region: str, verdict: MeridianError | None, hides: int = 0) -> None:
        self.region = region
        self.verdict = verdict
        self.hides = hides  # how many headers alone the bug hides too
        self.slow_s = 0.0  # how long a header alone waits for its answer
        self.calls: list[list[str]] = []  # the frames of each call

    async def Replicate(  # noqa: N802 - the generated servicer's name
        self,
        request_iterator: AsyncIterator[agent_pb2.ReplicateRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.ReplicateResponse:
        frames = [str(f.WhichOneof("frame")) async for f in request_iterator]
        self.calls.append(frames)
        if len(frames) > 1:
            await context.abort(grpc.StatusCode.INTERNAL, CORE_INTERNAL)
        await asyncio.sleep(self.slow_s)
        if self.hides > 0:
            self.hides -= 1
            await context.abort(grpc.StatusCode.INTERNAL, CORE_INTERNAL)
        if self.verdict is not None:
            await abort(context, self.verdict)  # type: ignore[arg-type]
        return agent_pb2.ReplicateResponse(region=self.region)


def a_write(store: ObjectStore) -> CommittedWrite:
    """A committed version of three chunks: its push is still sending when refused."""
    version = store.put(DS, "k", [os.urandom(CHUNK_BYTES) for _ in range(3)])
    return CommittedWrite(Admitted(PLACEMENT, 3, 1), DS, key="k", version=version)


class Pushing(NamedTuple):
    """A push's world: each replica region's fake agent, and eu-central's replication
    (the owner) with the write it pushes."""

    fakes: dict[str, GlitchingReplica]
    sync: SyncReplication
    write: CommittedWrite


class Start(Protocol):
    async def __call__(
        self, verdict: MeridianError | None, *, hides: int = 0, owner_now: OwnerNow | None = None
    ) -> Pushing: ...


@pytest.fixture
def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    opened = ObjectStore(tmp_path / "eu-central", clock=HybridClock("eu-central"))
    yield opened
    opened.close()


@pytest.fixture
async def start(store: ObjectStore) -> AsyncIterator[Start]:
    """Starts the fake replicas (each answering a header alone with `verdict`, the bug
    hiding the first `hides` of those answers too) and the owner's replication over
    `store`; after the test, the replication is closed, then the replicas stopped."""
    async with contextlib.AsyncExitStack() as started:

        async def pushing(
            verdict: MeridianError | None, *, hides: int = 0, owner_now: OwnerNow | None = None
        ) -> Pushing:
            fakes = {r: GlitchingReplica(r, verdict, hides) for r in PLACEMENT.replicas}
            peers = await started.enter_async_context(serving(fakes))
            sync = SyncReplication(
                store, "eu-central", peers, timeout_s=10, deltas=False, owner_now=owner_now
            )
            started.push_async_callback(sync.close)
            return Pushing(fakes, sync, a_write(store))

        yield pushing


async def test_a_stale_epoch_hidden_by_the_bug_fences_the_deposed_owners_write(
    store: ObjectStore, start: Start
) -> None:
    fakes, sync, write = await start(StaleEpochError(STALE))
    with pytest.raises(FencedError, match="epoch 3") as caught:
        await sync.replicate(write)
    assert not caught.value.retriable
    for fake in fakes.values():
        # the push (header and chunks), then the header alone, once
        assert fake.calls == [["header", "chunk", "chunk", "chunk"], ["header"]]
    # Fenced everywhere, acked nowhere: the deposed owner dropped its own copy.
    assert store.head(DS, "k") is None
    assert sync.behind(DS) == []  # a fence is no reason to catch a replica up


async def test_a_handover_hidden_by_the_bug_is_retriable(start: Start) -> None:
    fakes, sync, write = await start(UnavailableError("eu-west is handing over"))
    with pytest.raises(UnavailableError, match="handing over") as caught:
        await sync._push("eu-west", write, write.version, 10)  # type: ignore[arg-type]
    assert caught.value.retriable
    assert fakes["eu-west"].calls[1:] == [["header"]]


async def test_a_header_admitted_when_asked_again_is_retriable(start: Start) -> None:
    """A replica that refuses nothing at the header: the early end was no refusal. A
    header alone of a non-empty version is answered "short": retriable, and says why."""
    fakes, sync, write = await start(ShortStreamError("ended after 0 bytes"))
    with pytest.raises(UnavailableError, match="36066") as caught:
        await sync._push("eu-west", write, write.version, 10)  # type: ignore[arg-type]
    assert caught.value.retriable
    assert fakes["eu-west"].calls[1:] == [["header"]]  # asked once, not in a loop


async def test_a_fence_hidden_twice_more_still_fences(store: ObjectStore, start: Start) -> None:
    """The bug hides the header alone's status too, twice: the third ask gets the fence,
    and the deposed owner rewinds (a retriable error would leave its write standing)."""
    fakes, sync, write = await start(StaleEpochError(STALE), hides=2)
    with pytest.raises(FencedError, match="epoch 3"):
        await sync.replicate(write)
    for fake in fakes.values():
        assert fake.calls[1:] == [["header"]] * 3
    assert store.head(DS, "k") is None


async def test_a_status_hidden_every_time_is_asked_a_bounded_number_of_times(
    start: Start,
) -> None:
    fakes, sync, write = await start(StaleEpochError(STALE), hides=99)
    with pytest.raises(UnavailableError, match="36066") as caught:
        await sync._push("eu-west", write, write.version, 10)  # type: ignore[arg-type]
    assert caught.value.retriable
    assert fakes["eu-west"].calls[1:] == [["header"]] * 3


async def test_the_header_is_asked_again_within_the_pushs_deadline(start: Start) -> None:
    """A push of 1 s whose header alone would be answered after 5 s: the ask ends at
    the push's deadline (retriable), not `timeout_s` (10 s) later with a fence. (Bounds
    wide apart, for a loaded machine.)"""
    fakes, sync, write = await start(StaleEpochError(STALE))
    fakes["eu-west"].slow_s = 5.0
    started = time.monotonic()
    with pytest.raises(MeridianError) as caught:
        await sync._push("eu-west", write, write.version, 1.0)  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert not isinstance(caught.value, FencedError) and caught.value.retriable, caught.value
    assert took < 3.5, took
    # the header alone was asked (the push did not end before reaching the re-ask)
    assert fakes["eu-west"].calls[1:2] == [["header"]], fakes["eu-west"].calls


def etcd_names(region: str | None, epoch: int = 0) -> OwnerNow:
    """A fake `owner_now`: etcd names `region` at `epoch` the owner (None: no owner)."""

    async def owner_now(dataset: str) -> OwnerRecord | None:
        assert dataset == DS
        return None if region is None else OwnerRecord(DS, region, epoch)

    return owner_now


def etcd_moved(
    kind: str, to: str = "eu-west", epoch: int = 4, before: int = 3, source: str = "eu-central"
) -> OwnerNow:
    """A fake `owner_now`: ownership moved from `source` (at epoch `before`) to `to` at
    `epoch`, by a move of `kind`."""

    async def owner_now(dataset: str) -> OwnerRecord | None:
        return OwnerRecord(DS, to, epoch, moved_by=kind, moved_from=source, epoch_before=before)

    return owner_now


async def etcd_down(dataset: str) -> OwnerRecord | None:
    raise UnavailableError("etcd: no leader")


async def test_a_fence_hidden_on_every_ask_is_read_from_etcd_and_rewound(
    store: ObjectStore, start: Start
) -> None:
    """Every header alone hidden too, and the dataset failed over to eu-west at epoch 4:
    the deposed owner (the write admitted at epoch 3) is fenced, not asked to retry,
    and drops its own copy, as when the replica's fence was recovered."""
    fakes, sync, write = await start(
        StaleEpochError(STALE), hides=99, owner_now=etcd_names("eu-west", 4)
    )
    with pytest.raises(FencedError, match="etcd names eu-west") as caught:
        await sync.replicate(write)
    assert not caught.value.retriable
    for fake in fakes.values():
        assert fake.calls[1:] == [["header"]] * 3  # every ask hidden
    assert store.head(DS, "k") is None
    assert sync.behind(DS) == []  # a fence is no reason to catch a replica up


@pytest.mark.parametrize(
    ("region", "epoch"),
    [("eu-west", 4), ("eu-west", 3), ("eu-central", 4)],
    ids=["another-owner-newer-epoch", "another-owner", "this-region-newer-epoch"],
)
async def test_etcd_naming_another_owner_or_a_newer_epoch_is_a_fence(
    start: Start, region: str, epoch: int
) -> None:
    _fakes, sync, write = await start(
        StaleEpochError(STALE), hides=99, owner_now=etcd_names(region, epoch)
    )
    with pytest.raises(FencedError, match=f"etcd names {region} .* at epoch {epoch}"):
        await sync._push("eu-west", write, write.version, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "owner_now",
    [etcd_names("eu-central", 3), etcd_names(None), etcd_down],
    ids=["this-region-at-the-writes-epoch", "no-owner", "etcd-down"],
)
async def test_a_hidden_answer_etcd_does_not_show_as_a_fence_stays_retriable(
    store: ObjectStore, start: Start, owner_now: OwnerNow
) -> None:
    """Nothing says the replica fenced the write: retriable, and the write is kept."""
    _fakes, sync, write = await start(StaleEpochError(STALE), hides=99, owner_now=owner_now)
    behind: list[str] = []
    sync._mark_behind = lambda _write, region: behind.append(region)  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="36066") as caught:
        await sync.replicate(write)
    assert caught.value.retriable
    assert not isinstance(caught.value, FencedError)
    assert store.head(DS, "k") == write.version  # not rewound
    # Caught up later, as any failed push. Marked by the push's own end (a callback): a
    # push that ended in the same turn of the loop as the answer is marked a turn later
    # (a later write's push is ordered after it meanwhile, and fails with it: `_ordered`).
    await until(
        lambda: sorted(behind) == ["eu-north", "eu-west"], 5, what="both regions marked behind"
    )


@pytest.mark.parametrize(
    ("owner_now", "expected"),
    [(etcd_names("eu-west", 4), FencedError), (etcd_names("eu-central", 3), UnavailableError)],
    ids=["etcd-shows-the-fence", "etcd-shows-none"],
)
async def test_a_push_with_no_time_left_to_ask_again_still_reads_the_fence_from_etcd(
    start: Start, owner_now: OwnerNow, expected: type[MeridianError]
) -> None:
    """The early end came as the push's deadline ran out: no header is asked again,
    but etcd is still read, so a deposed owner is told it is fenced (and rewinds)."""
    fakes, sync, write = await start(StaleEpochError(STALE), owner_now=owner_now)
    header = sync._header(write, write.version)
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        with pytest.raises(MeridianError) as caught:
            await sync._early_answer(stub, header, "eu-west", "127.0.0.1:1", time.monotonic() - 1)
    assert type(caught.value) is expected or isinstance(caught.value, expected), caught.value
    if expected is UnavailableError:
        assert "no time is left" in str(caught.value)
        assert not isinstance(caught.value, FencedError)
    assert fakes["eu-west"].calls == []  # nothing asked: no time for it


async def test_the_etcd_read_of_a_hidden_fence_is_bounded_by_the_push(start: Start) -> None:
    """etcd hangs: the read ends with what is left of the push's 1 s deadline (at
    least `HIDDEN_FENCE_READ_S`), and the answer stays retriable. (Bound wide, for a
    loaded machine; unbounded, the push would wait for etcd for ever.)"""

    async def etcd_hangs(dataset: str) -> OwnerRecord | None:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    _fakes, sync, write = await start(StaleEpochError(STALE), hides=99, owner_now=etcd_hangs)
    started = time.monotonic()
    async with asyncio.timeout(20):  # a failure of the bound fails here, not by a hang
        with pytest.raises(UnavailableError, match="36066") as caught:
            await sync._push("eu-west", write, write.version, 1.0)  # type: ignore[arg-type]
    assert caught.value.retriable and not isinstance(caught.value, FencedError)
    assert time.monotonic() - started < 6, time.monotonic() - started


@pytest.mark.parametrize("kind", ["switchover", "drain"])
async def test_a_planned_handover_that_ended_the_writes_epoch_stays_retriable(
    store: ObjectStore, start: Start, kind: str
) -> None:
    """The replicas froze the write for a switchover (retriable) and the bug hid it on
    every ask; by the etcd read the handover has moved ownership on. A write during a
    handover is refused retriable (the writer finds the new owner), not fenced."""
    _fakes, sync, write = await start(
        StaleEpochError("eu-central is handing over"), hides=99, owner_now=etcd_moved(kind)
    )
    with pytest.raises(UnavailableError, match="36066") as caught:
        await sync.replicate(write)
    assert caught.value.retriable and not isinstance(caught.value, FencedError)
    assert store.head(DS, "k") == write.version  # as a handover's refusal leaves it


@pytest.mark.parametrize(
    ("owner_now"),
    [
        etcd_moved("failover"),
        etcd_moved("automatic"),
        etcd_moved("switchover", before=2),
        etcd_moved("switchover", source="eu-north"),
    ],
    ids=["failover", "automatic", "another-epochs-handover", "another-regions-handover"],
)
async def test_a_failover_or_another_epochs_handover_still_fences(
    start: Start, owner_now: OwnerNow
) -> None:
    _fakes, sync, write = await start(StaleEpochError(STALE), hides=99, owner_now=owner_now)
    with pytest.raises(FencedError, match="etcd names eu-west"):
        await sync.replicate(write)


@pytest.mark.parametrize(
    ("owner_now", "retriable"),
    [
        (etcd_moved("switchover"), True),
        (etcd_moved("drain"), True),
        (etcd_moved("failover"), False),
        (etcd_moved("switchover", before=2), False),
    ],
    ids=["switchover", "drain", "failover", "another-epochs-handover"],
)
async def test_a_write_whose_epoch_a_handover_ended_while_pushed_is_told_to_retry(
    store: ObjectStore, start: Start, owner_now: OwnerNow, retriable: bool
) -> None:
    """The replicas fenced the write (seen, not hidden): a switchover or drain from this
    region ended its epoch while it was pushed. A write during a handover is refused
    retriable (the writer finds the new owner); one a failover fenced is not. Acked
    nowhere, it is rewound here either way."""
    _fakes, sync, write = await start(StaleEpochError(STALE), owner_now=owner_now)
    with pytest.raises(MeridianError) as caught:
        await sync.replicate(write)
    assert caught.value.retriable is retriable, caught.value
    assert isinstance(caught.value, FencedError) is not retriable
    if retriable:
        assert "retry the write (against the new owner)" in str(caught.value)
    assert store.head(DS, "k") is None
