"""`SyncReplication`: the owner's synchronous push of a committed critical write.

After the owner's local commit (agents/service, `Replication` hook) the version is
pushed with `Replicate` to an agent of every replica region at once, and the call
returns once `copies_needed` regions hold it, counting the owner's own commit. A
small Put is handed on as soon as its version has its HLC, its local commit still
under way (`CommittedWrite.local`), so the push's round trip covers the commit: the
ack then also waits for that commit, and a failed one fails the write (its pushes
may have reached replicas: an unacked version, as when a quorum is missed):

* `ack: quorum`: a majority of home + replicas (2 of 2, 2 of 3, 3 of 4 or 5);
* `ack: all`: every one.

The ack names the regions that hold it. Pushes still running when the ack is
reached go on in the background (bounded by their deadline), so a straggler of a
quorum still gets its copy; should it fail, that replica is marked behind then. A
replica's commit counts toward an ack only once every push to it begun earlier has
succeeded (pushes run concurrently and may end out of order), so a region counted
holds every earlier write pushed to it.

When the ack cannot be reached (a replica down, partitioned, slower than its
deadline, or refusing) the call fails with a retriable `UnavailableError` naming
the regions that did not commit it; the owner's local copy stays and is logged as
unacked (`critical_write_unacked`). A replica's fencing refusal (its etcd names a
newer epoch) fails the call with that `StaleEpochError` (not retriable): this
owner was deposed. A retry of the same write is idempotent in content: it commits
a new version of the same bytes with a newer HLC, which every replica applies by
LWW over the unacked one, so what a reader sees afterwards is the retried bytes
whichever attempt reached which replica.

A 2-copy placement (home + 1 replica, quorum = 2) whose replica is gone refuses
writes until the replica is back or the operator changes the policy: durability
over availability (an ack from one copy would be lost with that copy).

**Catch-up.** A replica whose push failed (down, partitioned, refusing, too slow)
is marked behind for that dataset: it gets every new write pushed still, but its
commits do not count toward acks until a catch-up task of its own (one per dataset
and replica) has listed what it lacks (its agent's listing against this store's,
by HLC and digest, tombstones included) and pushed it in HLC order, retrying with
a bounded backoff while the replica is away. The mark is in memory: an owner that
restarts does not know who was behind (see the report of issue 13).

**Version sets.** A critical set's members are ordinary critical writes (each
pushed and acked as above); its CommitSet is then pushed with `ReplicateSet` (the
replica fences it like a `Replicate` and records it, visible there once every member
is stored, see replica_sets.py). A replica whose answer names members it lacks (a
straggler of the members' quorums) is pushed those members and the set again, so a
region counts toward the set's ack only when it shows the whole set: the ack covers
every member and the set record in `ack` regions. Catch-up pushes, besides the
newest version of each key, the members of the newest complete set and that set.

**Takeover.** On an owner's first write at a new epoch, a takeover pass per copy
region lists what it holds: the versions it lacks (older than that first write)
are pushed; a version it holds that this owner lacks is a write of an earlier
owner that did not reach this one. Older than the epoch's first write, it is
*adopted*: pulled here (`adopt`, Sync) and spread to the other copy regions, for it
may be an acked write of the old epoch that this owner missed (nothing acked is
dropped). Newer, and held by that region alone (every other copy region, this one
included, says it holds neither it nor anything newer), it can only be a deposed
owner's write made after this epoch began, never acked (an ack needs two regions):
it is *rewound* there (the `Rewind` call, fenced like a push), so it cannot
supersede a write acked at this epoch; the version that shows there then is judged
in turn. A delete is judged as a put: "held elsewhere" is read from a listing that
shows tombstones (`Stat` hides them, so an acked delete held by two regions once
looked lone), and a delete older than half the tombstone retention is left (another
region may have forgotten a newer delete). Held elsewhere, it is adopted whatever its
HLC says: an HLC alone says little when the two clocks differ. A proof reads every
agent of each region (a `complete` listing; the Rewind reaches every agent of the
region and its `dropped` is checked; the listed agent first reads the owner record,
so its fence refuses the old epoch, and lists only once the copies already past their
own owner read have committed: one it acked to the deposed owner just after listing
is never missed, agents/admission.py): a region, or an agent of one, that does not
answer decides nothing, and the version is left as it is until the pass, retried,
proves it either way. Either way the copies converge. The set a region
shows (its newest complete one), when newer than the one this owner shows, is
adopted as well: the record, then its members at the set's versions, each stored
for it even under a newer put of its key (without it, this owner would show the set
before it and spread that). A set newer than the
epoch's start that no other region shows was never acked and is not adopted. A set
stays on the agent that took it, and the agent asked answers `GetSet` from every agent
of its region (agents/routing/service.py), so a set held on another agent of a region
of several is seen there too; a region where no agent shows it, while one did not
answer, decides nothing. A
deposed owner also rewinds its own write at once when a replica fences it and no
region took it (a `StaleEpochError`: the write can never be acked).

**Batches.** A small version (below 64 KiB, not a set member) goes through the
region's push lane (push_lanes.py): alone at once while no call runs to that
region, else queued and sent, once a call slot is free (3 in flight) and the queue
is worth a call, with whatever else queued meanwhile in one `ReplicatePushes`,
fenced per item and committed in one transaction by the replica
(replica_pushes.py). Each item keeps its own answer, so the counting above holds
per write.

**Fenced, or re-claimed?** A replica's stale refusal is a loss of ownership only if
etcd, read now (`owner_now`), names another owner or no newer epoch of this region;
when this region re-claimed the dataset (the watch had not delivered it when the
write was admitted at the old epoch) the answer is retriable (`_fenced_answer`).
A fence the grpc bug hid on every ask (early_status.py) is read from etcd likewise
(`_hidden_fence`): another owner or a newer epoch there is that fence, and is
answered (and rewound) as one, except when a planned handover (switchover, drain)
from this region ended the write's epoch: the hidden answer is then as likely the
handover's retriable refusal, and is answered as that one (retriable, the write left
for the new owner's takeover to adopt or rewind, as after a refusal seen).

**Older answers.** A replica holding a newer version of the key answers a push
"older"; that counts as holding it only when the newer version is this owner's or
held here (`_check_newer`): over another owner's write (maybe a lone one, rewound
later) an ack would rest on a copy that is not there.

**Deltas.** A version of at least 64 KiB is pushed as a delta against the version
the replica holds (the one it was last seen to commit, else this store's previous
one), patched by the replica as it arrives; a replica without that basis answers at
once and gets the version whole, within what is left of the push's deadline
(delta_push.py says why a push and not a pull).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from agents.admission import Admitted, OwnerRecord
from agents.metrics import AgentMetrics
from agents.replication.delta_push import (
    DELTA_MIN_BYTES,
    ReplicaBases,
    choose_basis,
    delta_frames,
)
from agents.replication.early_status import core_internal, header_alone
from agents.replication.peers import Peers
from agents.replication.push_lanes import BATCH_ITEM_MAX, BATCH_MAX, BatchRefusedError, PushLane
from agents.replication.replica_sets import MAX_SETS
from agents.rpc.status import error_from_parts, from_rpc_error
from agents.service.servicer import CommittedWrite
from agents.store import (
    CHUNK_BYTES,
    DigestMismatchError,
    ObjectStore,
    SetRecord,
    ShortStreamError,
)
from agents.to_the_end import open_in_thread
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.domain.hlc import HLC
from controlplane.domain.placement import DEFAULT_ACK, Placement
from controlplane.domain.version import Verdict, Version
from controlplane.errors import (
    FencedError,
    InvalidInputError,
    MeridianError,
    NotFoundError,
    UnavailableError,
)
from controlplane.logs import get_logger
from meridian.convert import (
    version_from_wire,
    version_set_from_wire,
    version_set_to_wire,
    version_to_wire,
)
from meridian.v1 import agent_pb2, agent_pb2_grpc, types_pb2

log = get_logger("meridian.agent.replication")

_T = TypeVar("_T")

Held = tuple[str, Version, str | None]  # key, version, the set it was written in
Local = tuple[list[Held], list[SetRecord], list[Held]]  # newest, latest set, its members
# (dataset, key, version, source region, source address, the set to store it as a
# member of: the one it was written in, or the set a takeover adopts) -> whether it is
# held here now.
Adopt = Callable[[str, str, Version, str, str, str | None], Awaitable[bool]]
# dataset -> its owner record read from etcd now (`Admission.owner_now`).
OwnerNow = Callable[[str], Awaitable[OwnerRecord | None]]

# Moves of ownership that a handover mark froze writes for first (ownership.py).
PLANNED_MOVES = ("switchover", "drain")


def _handed_over(owner: OwnerRecord, region: str, epoch: int) -> bool:
    """Whether etcd's owner record says a planned handover (switchover, drain) from
    `region` ended `epoch`: a write admitted at it was caught by a handover, not fenced
    by a failover (the contract: the first retriable, the second not)."""
    return (
        owner.moved_by in PLANNED_MOVES
        and owner.moved_from == region
        and owner.epoch_before == epoch
    )


# Takeover passes that list and push at once (the others wait their turn).
TAKEOVER_PASSES = 4
# Versions one pass rewinds of one key, each showing the one before it (a deposed owner
# rarely makes more than one lone write to a key; the next pass goes on).
REWINDS_PER_KEY = 8
# Tries of one catch-up (each retry waits up to retry_max_s) and of one takeover pass:
# both go on while they stand (a pass is never started again at its epoch, and a region
# back after an hour still needs it), and end when fenced, superseded or unplaced.
CATCH_UP_ATTEMPTS = 1_000_000
TAKEOVER_ATTEMPTS = 1_000_000
# Keys proven at once when tombstones of a critical dataset may expire (one listing
# call per copy region each).
_PROOFS_IN_FLIGHT = 8

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 4 * CHUNK_BYTES),
    ("grpc.max_receive_message_length", 4 * CHUNK_BYTES),
]


def copy_regions(placement: Placement) -> tuple[str, ...]:
    """Every region that keeps a copy of the dataset: home and replicas, each once."""
    return _copy_regions(placement.home, placement.replicas)


def push_targets(placement: Placement, owner: str) -> tuple[str, ...]:
    """Where the owner pushes a write: every other copy region. After a failover the
    owner is a replica region and the home is one of them (the chaos suite found the
    owner pushing to `replicas`, itself included, and never to the home)."""
    return _push_targets(placement.home, placement.replicas, owner)


def copies_needed(placement: Placement) -> int:
    """How many regions (the owner included) must hold a write before it is acked."""
    copies = len(copy_regions(placement))
    if (placement.ack or DEFAULT_ACK) == "all":
        return copies
    return copies // 2 + 1


# Asked several times for every critical write, of a handful of placements: cached by
# the fields they depend on (a Placement's own hash covers all of its fields).
@functools.lru_cache(maxsize=1024)
def _copy_regions(home: str, replicas: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r for r in (home, *replicas) if r))


@functools.lru_cache(maxsize=1024)
def _push_targets(home: str, replicas: tuple[str, ...], owner: str) -> tuple[str, ...]:
    return tuple(r for r in _copy_regions(home, replicas) if r != owner)


# The header alone, asked again while grpc/grpc#36066 still hides its status (the
# tests' raw pushes need as many: tests/harness/raw_replicate.py).
EARLY_ASKS = 3
# The etcd read of a fence the grpc bug hid (`_hidden_fence`) gets what is left of the
# push's deadline, but at least this: a deposed owner learnt late is still told, and
# rewinds its write (an answer left retriable keeps it standing).
HIDDEN_FENCE_READ_S = 1.0


class SyncReplication:
    """See the module docstring. `timeout_s` bounds a small push; a large one gets
    `size / min_rate_bps` more."""

    def __init__(
        self,
        store: ObjectStore,
        region: str,
        peers: Peers,
        *,
        timeout_s: float = 5.0,
        min_rate_bps: float = 8 * 1024 * 1024,
        deltas: bool = True,
        delta_threads: int = 1,
        adopt: Adopt | None = None,
        takeover_passes: int = TAKEOVER_PASSES,
        owner_now: OwnerNow | None = None,
        batch_max: int = BATCH_MAX,
        metrics: AgentMetrics | None = None,
        copies_received: Callable[[str], Awaitable[None]] | None = None,
        alone_in_region: Callable[[], bool] = lambda: True,
        placement_now: Callable[[str], Placement] | None = None,
    ) -> None:
        self.store = store
        self.region = region
        self.peers = peers
        self.timeout_s = timeout_s
        self.min_rate_bps = min_rate_bps
        self._channels: dict[str, grpc.aio.Channel] = {}
        # A stub per address, as its channel: making one builds a callable for every
        # method of the API (about 1 % of an owner's CPU when made per push).
        self._stubs: dict[str, agent_pb2_grpc.AgentAsyncStub] = {}
        self._background: set[asyncio.Future[str]] = set()
        self._pushes: set[asyncio.Future[str]] = set()
        # (dataset, replica) -> settled once every push of new writes to it so far has
        # ended, with the newest failure among them and its push's number (`_ordered`);
        # dropped once settled.
        self._settled: dict[tuple[str, str], asyncio.Future[_Failure | None]] = {}
        # Pushes are numbered; (dataset, replica) -> the number up to which failures are
        # healed: a catch-up that ended with the replica caught up listed this owner's
        # store after every push so far had begun, and pushed what it lacked of it. A
        # lane's failure is carried to every later push while pushes overlap (under
        # load, always): without this, it kept the replica out of acks for good.
        self._push_seq = 0
        self._listed_at: dict[tuple[str, str], int] = {}
        self._healed: dict[tuple[str, str], int] = {}
        # dataset -> this region's own commits still running while their pushes go out
        # (`CommittedWrite.local`): a takeover pass waits for them (`_commits_ended`).
        self._committing: dict[str, set[asyncio.Future[Version]]] = {}
        # (dataset, replica) -> its catch-up task, while that replica is behind.
        self._behind: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Those marked behind again while their catch-up ran: it makes one more pass.
        self._again: set[tuple[str, str]] = set()
        # Deltas against what each replica holds (delta_push.py); False: always whole.
        self.deltas = deltas
        self.delta_threads = delta_threads
        self.bases = ReplicaBases()
        self.retry_initial_s = 0.2
        self.retry_max_s = 5.0
        # dataset -> the epoch whose takeover pass was started (see `_reconcile`).
        self._reconciled: dict[str, int] = {}
        self._reconciles: set[asyncio.Task[None]] = set()
        # (dataset, region) -> its running takeover pass / the pass asked for meanwhile.
        self._passes: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._pass_again: dict[tuple[str, str], tuple[CommittedWrite, HLC]] = {}
        self._pass_gate = asyncio.Semaphore(takeover_passes)
        # Pulls a version another copy region holds into this store (the takeover pass).
        self.adopt = adopt
        # Awaited before a set is adopted (the daemon's roster lowering, as for a Put).
        self.holding_sets: Callable[[], Awaitable[None]] | None = None
        # dataset -> the admission of the newest epoch written at here (what catch-ups
        # push at), as a write of nothing.
        self._latest: dict[str, CommittedWrite] = {}
        # Tells a replica's stale refusal of a re-claim by this region (retriable) from
        # a real loss of ownership (`_fenced_answer`).
        self.owner_now = owner_now
        # Waits for the copies of a dataset this agent is receiving, past their owner
        # read (Admission.received): a handover's target commits the old owner's last
        # copies through the freeze while its own pass may already read its store.
        self.copies_received = copies_received
        # False while other agents share this region: each holds the keys it is the
        # primary of, so a takeover pass counts theirs as ours (`_takeover_once`).
        self.alone_in_region = alone_in_region
        # The dataset's placement under the policy this agent applies now (raising when
        # it cannot say): a catch-up of a region the policy moved away ends on it,
        # though no write comes to say so (`_placed_away`).
        self.placement_now = placement_now
        # (dataset, region) whose catch-up ended as the policy moved the copy away (by
        # the newest write's placement or by this view): not counted toward acks (a
        # write admitted before the change may still push there) until a catch-up,
        # begun by a write naming it again (`_catch_up_added`, `_catch_up_returned`),
        # brings it level.
        self._moved_away: set[tuple[str, str]] = set()
        # region -> its push lane (push_lanes.py): small pushes queued behind the ones
        # running to that region go together in one ReplicatePushes; 1: never batched.
        self.batch_max = batch_max
        self._lanes: dict[str, PushLane] = {}
        self.metrics = metrics  # the lanes' push times, when the daemon counts them

    def behind(self, dataset: str) -> list[str]:
        """The replicas of `dataset` catching up (not counted toward acks)."""
        return sorted(r for (ds, r) in self._behind if ds == dataset)

    async def replicate(self, write: CommittedWrite) -> tuple[str, ...]:
        placement = write.admitted.placement
        if write.local is not None and not write.local.done():
            self._track_commit(write.dataset, write.local)
        if not push_targets(placement, self.region):
            if write.local is not None:
                await asyncio.shield(write.local)  # a cancelled ack leaves it running
            return (self.region,)
        latest = self._latest.get(write.dataset)
        # By epoch, then policy revision: a write admitted just before a policy change
        # that ends after one admitted after it must not bring the old placement back.
        if latest is None or (latest.admitted.epoch, latest.admitted.policy_revision) <= (
            write.admitted.epoch,
            write.admitted.policy_revision,
        ):
            # Its admission only: kept per dataset for as long as the agent runs, so
            # not its bytes, its set or its commit.
            self._latest[write.dataset] = CommittedWrite(write.admitted, write.dataset)
            if latest is not None:
                self._catch_up_added(write, latest)
            if self._moved_away:
                self._catch_up_returned(write)
        self._reconcile_after_takeover(write)
        push: Callable[[str], Awaitable[str]]
        if write.set_record is not None:
            record = write.set_record
            size = await asyncio.to_thread(self._members_size, record)
            deadline = self.timeout_s + size / self.min_rate_bps
            what = f"set {record.set_id} of critical dataset {write.dataset} at {record.hlc}"

            def push(region: str) -> Awaitable[str]:
                return self._push_sets(region, write, [record], deadline)

        elif write.version is not None and write.key is not None:
            version = write.version
            deadline = self.timeout_s + version.size / self.min_rate_bps
            what = f"critical write {write.dataset}/{write.key} at {version.hlc}"
            batched = self.batch_max > 1 and write.set_id is None and version.size < BATCH_ITEM_MAX

            def push(region: str) -> Awaitable[str]:
                if batched:
                    return self._lane(region).submit(write, version, deadline)
                return self._push(region, write, version, deadline)

        else:
            raise InvalidInputError(f"a committed write of {write.dataset} names nothing to push")
        return await self._acked(write, what, deadline, push)

    async def _acked(
        self,
        write: CommittedWrite,
        what: str,
        deadline: float,
        push: Callable[[str], Awaitable[str]],
    ) -> tuple[str, ...]:
        """Push to every replica at once; the regions holding it once `copies_needed`
        do (the owner first), or the error that says why they cannot."""
        placement = write.admitted.placement
        need = copies_needed(placement)
        targets = push_targets(placement, self.region)
        tasks = {self._ordered(write, region, push(region)): region for region in targets}
        # This region's copy, counted from the start; when it is still committing
        # (`write.local`: pushed meanwhile), it must be durable before the ack, below.
        held = [self.region]
        errors: dict[str, MeridianError] = {}
        pending = set(tasks)
        until = time.monotonic() + deadline
        try:
            while pending and len(held) < need and len(held) + len(pending) >= need:
                done, pending = await asyncio.wait(
                    pending,
                    timeout=max(0.0, until - time.monotonic()),
                    return_when="FIRST_COMPLETED",
                )
                if not done:
                    break
                for task in done:
                    region = tasks[task]
                    exc = task.exception()
                    if exc is None and (
                        (write.dataset, region) in self._behind
                        or (self._moved_away and (write.dataset, region) in self._moved_away)
                    ):
                        pass  # committed, but it may lack earlier versions: not counted yet
                    elif exc is None:
                        held.append(region)
                    elif isinstance(exc, MeridianError):
                        errors[region] = exc
                    else:
                        errors[region] = UnavailableError(f"{type(exc).__name__}: {exc}")
        finally:
            # However the wait ended (answered, or the call cancelled meanwhile): those
            # still pushing go on to their own deadline, never awaited, their outcome
            # read. Should one fail, the region is caught up then (`_push_ended`);
            # while it runs, the region's later commits count only once it is done
            # (`_ordered`). (It was marked behind at once: under load nearly every
            # write's straggler was, so one replica never counted and catch-up rounds
            # ran back to back.)
            for task in pending:
                self._background.add(task)
                task.add_done_callback(functools.partial(self._finished, tasks[task]))
        if write.local is not None:
            # Whatever the replicas answered: the write is this region's only once its
            # own commit is (a failed one fails the write, acked nowhere), and what
            # follows (a rewind of a fenced write) needs it committed.
            await asyncio.shield(write.local)
        if len(held) >= need:
            return tuple(held)
        missing = [r for r in targets if r not in held]
        log.warning(
            "critical_write_unacked",
            dataset=write.dataset,
            what=what,
            held=held,
            missing=missing,
            needed=need,
            errors={r: str(e) for r, e in errors.items()},
        )
        fenced = next((e for e in errors.values() if isinstance(e, FencedError)), None)
        if fenced is not None:
            answer = await self._fenced_answer(write, what, fenced)
            if held == [self.region] and not pending:
                await self._rewind_own(write, fenced)
            raise answer
        timed_out = time.monotonic() >= until
        why = "; ".join(
            f"{r}: {errors[r]}"
            if r in errors
            else (f"{r}: no answer within {deadline:.1f} s" if timed_out else f"{r}: still pushing")
            for r in missing
        )
        raise UnavailableError(
            f"{what} is committed in {', '.join(held)} but not acked: ack "
            f"{placement.ack or DEFAULT_ACK} needs {need} of {len(copy_regions(placement))} "
            f"regions ({why}); retry the write"
        )

    def _lane(self, region: str) -> PushLane:
        lane = self._lanes.get(region)
        if lane is None:
            lane = self._lanes[region] = PushLane(
                region,
                alone=functools.partial(self._push, region),
                together=functools.partial(self._push_many, region),
                most=self.batch_max,
                metrics=self.metrics,
            )
        return lane

    async def _push_many(
        self, region: str, items: list[tuple[CommittedWrite, Version]], deadline_s: float
    ) -> list[MeridianError | None]:
        """Push small whole versions to `region` in one ReplicatePushes: per item, None
        (committed there) or why not. Raises when the call itself fails (every item
        failed); `BatchRefusedError` when the agent takes no batch."""
        try:
            address = await self.peers.address(region)
            stub = self._stub(address)
            if all(_inline(w, v) is not None or v.is_tombstone for w, v in items):
                datas = self._read_many(items)  # every one held in memory: no thread hop
            else:
                datas = await asyncio.to_thread(self._read_many, items)
            # An item whose version is gone (superseded and pruned while it waited in
            # the queue) fails alone; the others still go.
            sent = [(n, data) for n, data in enumerate(datas) if isinstance(data, bytes)]
            if not sent:
                return [d if isinstance(d, MeridianError) else None for d in datas]
            request = agent_pb2.ReplicatePushesRequest(
                items=[
                    agent_pb2.PushedItem(header=self._header(*items[n]), data=data)
                    for n, data in sent
                ]
            )
            try:
                resp = await stub.ReplicatePushes(request, timeout=deadline_s)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise BatchRefusedError(f"{region} ({address}) takes no batch") from err
                raise from_rpc_error(err, f"{region} ({address})") from err
            _check_region(resp.region, region, address)
            if len(resp.results) != len(sent):
                raise UnavailableError(
                    f"{region} ({address}) answered {len(resp.results)} pushes for {len(sent)}"
                )
        except BatchRefusedError:
            raise
        except BaseException:
            self.peers.forget(region)
            raise
        answers: list[MeridianError | None] = [
            d if isinstance(d, MeridianError) else None for d in datas
        ]
        for (n, _data), got in zip(sent, resp.results, strict=True):
            write = items[n][0]
            if got.error_code or got.error_class:
                answers[n] = error_from_parts(got.error_class, got.error_code, got.error)
                continue
            if not got.HasField("held"):  # neither an error nor a commit: not held
                answers[n] = UnavailableError(
                    f"{region} ({address}) answered a push of {write.dataset}/{write.key} "
                    "with neither a version nor an error"
                )
                continue
            try:
                await self._check_newer(
                    region, write.dataset, write.key or "", items[n][1], got.held
                )
            except UnavailableError as exc:
                answers[n] = exc
                continue
            self._committed(
                region,
                write.dataset,
                write.key or "",
                agent_pb2.ReplicateResponse(version=got.held, region=resp.region),
            )
        return answers

    def _read_many(
        self, items: list[tuple[CommittedWrite, Version]]
    ) -> list[bytes | MeridianError]:
        out: list[bytes | MeridianError] = []
        for write, version in items:
            if version.is_tombstone:
                out.append(b"")
                continue
            data = _inline(write, version)
            if data is not None:
                out.append(data)
                continue
            try:
                out.append(self.store.read_bytes(write.dataset, write.key or "", version.hlc.text))
            except MeridianError as exc:
                out.append(exc)
        return out

    def _header(self, write: CommittedWrite, version: Version) -> agent_pb2.ReplicateHeader:
        header = agent_pb2.ReplicateHeader(
            dataset=write.dataset,
            key=write.key or "",
            version=version_to_wire(version),
            epoch=write.admitted.epoch,
            origin_region=self.region,
            policy_revision=write.admitted.policy_revision,
        )
        if write.set_id is not None:
            header.set = write.set_id
        return header

    def _members_size(self, record: SetRecord) -> int:
        total = 0
        for key, hlc in record.members.items():
            with contextlib.suppress(MeridianError):
                total += self.store.stat(record.dataset, key, hlc).version.size
        return total

    async def _push_sets(
        self, region: str, write: CommittedWrite, records: list[SetRecord], deadline_s: float
    ) -> str:
        """Push set records to `region`; members it lacks are pushed and the sets again,
        so this returns only once every set is complete (visible) there."""
        try:
            return await self._push_sets_to(region, write, records, deadline_s)
        except BaseException:
            self.peers.forget(region)
            raise

    async def _push_sets_to(
        self, region: str, write: CommittedWrite, records: list[SetRecord], deadline_s: float
    ) -> str:
        address = await self.peers.address(region)
        stub = self._stub(address)
        request = agent_pb2.ReplicateSetRequest(
            sets=[version_set_to_wire(r.as_version_set()) for r in records],
            epoch=write.admitted.epoch,
            origin_region=self.region,
            policy_revision=write.admitted.policy_revision,
        )
        for attempt in range(2):  # push the sets, the members they lack, the sets again
            try:
                resp = await stub.ReplicateSet(request, timeout=deadline_s)
            except grpc.aio.AioRpcError as err:
                raise from_rpc_error(err, f"{region} ({address})") from err
            _check_region(resp.region, region, address)
            if len(resp.sets) != len(records):
                raise UnavailableError(
                    f"{region} ({address}) answered {len(resp.sets)} sets for {len(records)}"
                )
            lacking = [
                (r, list(got.missing))
                for r, got in zip(records, resp.sets, strict=True)
                if not got.complete
            ]
            if not lacking:
                return region
            if attempt == 1 or any(not keys for _, keys in lacking):
                break
            await self._push_members(region, write, lacking, deadline_s)
        names = "; ".join(
            f"set {r.set_id} lacks {', '.join(k)}" if k else f"a newer set {r.set_id} is held"
            for r, k in lacking
        )
        raise UnavailableError(f"{region} does not show the sets of {write.dataset}: {names}")

    async def _push_members(
        self,
        region: str,
        write: CommittedWrite,
        lacking: list[tuple[SetRecord, list[str]]],
        deadline_s: float,
    ) -> None:
        gate = asyncio.Semaphore(4)

        async def one(record: SetRecord, key: str) -> None:
            stored = await asyncio.to_thread(
                self.store.stat, record.dataset, key, record.members[key]
            )
            member = CommittedWrite(
                write.admitted,
                record.dataset,
                key=key,
                version=stored.version,
                set_id=record.set_id,
            )
            async with gate:
                await self._push(region, member, stored.version, deadline_s)

        await asyncio.gather(*(one(r, k) for r, keys in lacking for k in keys))

    def _catch_up_added(self, write: CommittedWrite, before: CommittedWrite) -> None:
        """A copy region the policy added since the dataset's previous write here holds
        none of its earlier versions, yet its pushes of new writes succeed: it is caught
        up (marked behind, so not counted toward acks) before it counts."""
        now = push_targets(write.admitted.placement, self.region)
        was = push_targets(before.admitted.placement, self.region)
        if now is was:  # the same placement (the targets are cached per placement)
            return
        for region in now:
            if region not in was:
                log.info("replica_added", dataset=write.dataset, region=region)
                self._mark_behind(write, region)

    def _catch_up_returned(self, write: CommittedWrite) -> None:
        """A region whose catch-up ended as the policy moved it away (`_placed_away`)
        missed what was written meanwhile: named again, it is caught up before it
        counts (it counts again once that catch-up ends caught up)."""
        for region in push_targets(write.admitted.placement, self.region):
            pair = (write.dataset, region)
            if pair in self._moved_away and pair not in self._behind and self._named_now(pair):
                log.info("replica_returned", dataset=write.dataset, region=region)
                self._mark_behind(write, region)

    def _named_now(self, pair: tuple[str, str]) -> bool:
        """Whether the policy this agent applies now names the region as a copy of the
        dataset (True when it cannot say): a write admitted before it moved the copy
        away starts no catch-up that would end at once."""
        if self.placement_now is None:
            return True
        try:
            return pair[1] in copy_regions(self.placement_now(pair[0]))
        except MeridianError:
            return True

    def _placed_away(self, current: CommittedWrite, region: str) -> bool:
        """Whether the policy moved `region`'s copy of the dataset away: the newest
        write's placement no longer names it, or the policy this agent applies now does
        not (a dataset no one writes to gets no write to say so; a refusal that would
        never clear, such as a narrowed residency, is not retried for ever). A policy
        it cannot read now decides nothing."""
        if region not in push_targets(current.admitted.placement, self.region):
            # Not counted either: a write admitted before the change may still push there.
            self._moved_away.add((current.dataset, region))
            return True
        if self.placement_now is None:
            return False
        try:
            placement = self.placement_now(current.dataset)
        except MeridianError:
            return False
        if region in copy_regions(placement):
            return False
        self._moved_away.add((current.dataset, region))
        return True

    def _mark_behind(self, write: CommittedWrite, region: str) -> None:
        key = (write.dataset, region)
        if key in self._behind:
            # Its running pass may have listed before this failed write: one more after it.
            self._again.add(key)
            return
        log.warning("replica_behind", dataset=write.dataset, region=region)
        self._behind[key] = asyncio.create_task(
            self._catch_up(write, region), name=f"catch-up {write.dataset} {region}"
        )

    async def _catch_up(self, write: CommittedWrite, region: str) -> None:
        """Push what `region` lacks of the dataset, oldest first, until it lacks nothing
        (then its commits count toward acks again); stops when this owner is fenced,
        or when the policy moved the region's copy away (`_placed_away`). Any other
        refusal is retried (backing off to `retry_max_s`): the region stays out of acks,
        the safe side, until what refuses (a policy, a region's residency) is fixed.
        Each pass pushes at the newest epoch this owner has written at: a catch-up begun
        at an older epoch (this region took the dataset back meanwhile) would be fenced
        and give up on a replica that still lacks the new epoch's writes (chaos
        scenario 10 found one)."""
        pair = (write.dataset, region)

        async def once() -> int | None:
            current = self._latest.get(write.dataset, write)
            if self._placed_away(current, region):
                return None  # nothing to catch up there
            for _epoch in range(1_000):  # bounded: each turn needs a newer epoch of ours
                try:
                    return await self._catch_up_once(current, region)
                except FencedError:
                    newer = self._latest.get(write.dataset, write)
                    if newer.admitted.epoch <= current.admitted.epoch:
                        raise
                    current = newer  # a newer epoch of ours: push at it
            return await self._catch_up_once(current, region)

        try:
            for _round in range(CATCH_UP_ATTEMPTS):  # one more per write failed there meanwhile
                try:
                    pushed = await self._retried(
                        "catch_up_retry", write.dataset, region, once, CATCH_UP_ATTEMPTS
                    )
                except FencedError as exc:
                    log.warning(
                        "catch_up_fenced", dataset=write.dataset, region=region, error=str(exc)
                    )
                    return
                except MeridianError as exc:
                    log.warning(
                        "catch_up_gave_up", dataset=write.dataset, region=region, error=str(exc)
                    )
                    return
                if pushed is None:
                    log.info("catch_up_unplaced", dataset=write.dataset, region=region)
                    return
                if pair in self._again:
                    self._again.discard(pair)
                    await asyncio.sleep(self.retry_initial_s)  # a write failed there meanwhile
                    continue
                log.info("replica_caught_up", dataset=write.dataset, region=region, pushed=pushed)
                self._moved_away.discard(pair)
                listed = self._listed_at.get(pair, 0)
                self._healed[pair] = max(self._healed.get(pair, 0), listed)
                return
        finally:
            self._behind.pop(pair, None)
            self._again.discard(pair)
            self._listed_at.pop(pair, None)

    async def _retried(
        self,
        event: str,
        dataset: str,
        region: str,
        attempt: Callable[[], Awaitable[_T]],
        attempts: int,
    ) -> _T:
        """`attempt()` until it does not fail with a MeridianError, at most `attempts`
        times (then its last error), waiting a doubling backoff between tries (from
        `retry_initial_s` up to `retry_max_s`) and reading the region's address from
        etcd again. A FencedError is raised at once: this owner was deposed (or the
        caller knows better). The catch-up and the takeover pass both retry this way."""
        delay = self.retry_initial_s
        for _attempt in range(attempts - 1):
            try:
                return await attempt()
            except FencedError:
                raise
            except MeridianError as exc:
                self.peers.forget(region)
                log.info(event, dataset=dataset, region=region, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(self.retry_max_s, delay * 2)
        return await attempt()

    async def _catch_up_once(self, write: CommittedWrite, region: str) -> int:
        """One pass; the number of versions pushed. Raises when one cannot be."""
        address = await self.peers.address(region)
        theirs = await self._listing(address, write.dataset)
        # Every push numbered up to here has begun, so its version is in the snapshot
        # below: once this pass ends caught up, their failures are healed.
        self._listed_at[(write.dataset, region)] = self._push_seq
        # Ours after our commits then running end (as a takeover pass reads it): one
        # pushed there while it committed here, whose push failed, would be missing
        # from our snapshot and never pushed, and the region counted caught up.
        await self._commits_ended(write.dataset)
        local = await asyncio.to_thread(self._local, write.dataset)
        return await self._push_lacking(write, region, theirs, local, None)

    def _track_commit(self, dataset: str, local: asyncio.Future[Version]) -> None:
        running = self._committing.setdefault(dataset, set())
        running.add(local)

        def ended(done: asyncio.Future[Version]) -> None:
            running.discard(done)
            if not running and self._committing.get(dataset) is running:
                del self._committing[dataset]

        local.add_done_callback(ended)

    async def local_commits_ended(self, dataset: str) -> None:
        """Every commit of `dataset` in this store whose push had begun has ended (what
        a complete listing of this agent waits for, Admission.local_commits: another
        agent of this region proving a version lone must see this one's writes)."""
        running = self._committing.get(dataset)
        if running:
            await asyncio.wait(list(running))  # wait, never cancel: they are the writes'

    async def _commits_ended(self, dataset: str) -> None:
        """Every commit of `dataset` in this store whose push had begun has ended. A
        version is pushed while its own commit runs here, so a replica may list one
        that this store does not list yet: a takeover pass that read theirs first would
        take it for another owner's lone write and rewind an acked one."""
        await self.local_commits_ended(dataset)
        if self.copies_received is not None:
            # And the copies pushed here by the owner before us (a switchover's target
            # takes them through the freeze): read before they commit, one acked there
            # would be missing from our snapshot, never pushed on, held on one copy.
            await self.copies_received(dataset)

    async def _takeover_once(
        self, write: CommittedWrite, region: str, older_than: HLC
    ) -> tuple[int, int, int]:
        """One takeover pass over `region` (module docstring): versions pushed, adopted
        (a set record counts one), rewound. Ours is read after theirs, and after our
        commits then running end, so every version of ours they hold is in it: what
        they hold and we lack came from another owner."""
        address = await self.peers.address(region)
        # Complete: a version missed on an agent that did not answer would be neither
        # adopted nor rewound, and never looked at again.
        written_in: dict[str, str] = {}  # key -> the set its newest there was written in
        theirs = await self._listing(address, write.dataset, complete=True, sets=written_in)
        await self._commits_ended(write.dataset)
        local = await asyncio.to_thread(self._local, write.dataset)
        ours = {key: version for key, version, _ in local[0]}
        if not self.alone_in_region():
            # The region's other agents commit (and push) the keys they are primary of:
            # those are this region's, not another owner's, so neither adopted here nor
            # proven lone. Read after theirs as ours is; each agent's complete listing
            # waits for its own commits whose pushes began (Admission.local_commits).
            here = await self._proof_address(self.region)
            for key, version in (await self._listing(here, write.dataset, complete=True)).items():
                held = ours.get(key)
                if held is None or held.hlc < version.hlc:
                    ours[key] = version
        extras = sorted(
            ((k, v) for k, v in theirs.items() if _extra(ours.get(k), v)),
            key=lambda kv: kv[1].hlc,
        )
        adopted = rewound = 0
        rewinds: set[str] = set()
        unresolved: dict[str, str] = {}  # key (or set) -> why it was left for a retry
        for key, version in extras:
            try:
                took, dropped, newest = await self._settle_extra(
                    write,
                    region,
                    address,
                    key,
                    (version, written_in.get(key)),
                    ours.get(key),
                    older_than,
                )
            except FencedError:
                raise
            except _UnresolvedError as exc:
                # Left as it is (what shows there now: neither adopted nor rewound): the
                # pass goes on with the other keys and is retried (below), which decides
                # it then. A version after it that was rewound already marked the
                # region behind as it was dropped (`_settle_extra`).
                unresolved[key] = str(exc)
                rewound += exc.rewound  # each marked the region behind as it was dropped
                continue
            except MeridianError:
                if adopted:
                    # The retried pass finds what was adopted here as ours, adopts
                    # nothing and would not spread it to regions whose passes are over
                    # (review): spread now, as below for an unresolved key.
                    self._spread_adopted(write, region, older_than)
                raise
            adopted += took
            rewound += dropped
            if dropped:
                rewinds.add(key)
                # What this pass pushes below comes from its snapshot and is forgotten
                # if the pass is retried, yet the region may have answered "older"
                # (counted toward an ack) to a write of ours against the version just
                # rewound: `_settle_extra` marked the region behind as it dropped it. A
                # catch-up lists it afresh, retries until it lacks nothing, and keeps it
                # out of acks meanwhile (review: a failed push, or a write committed
                # during the pass, left an acked write on one copy).
            if newest is None:
                theirs.pop(key, None)
            else:
                theirs[key] = newest
        if adopted:
            local = await asyncio.to_thread(self._local, write.dataset)
        # After the versions: a lone set's lone members are rewound by now, so the set
        # that region shows is one it may hold with another region.
        try:
            if await self._adopt_set(write, region, address, older_than, local):
                adopted += 1
                local = await asyncio.to_thread(self._local, write.dataset)
        except _UnresolvedError as exc:
            unresolved["(the set it shows)"] = str(exc)
        pushed = await self._push_lacking(write, region, theirs, local, older_than, rewinds)
        if unresolved:
            if adopted:
                # Adopted here now, so the retried pass finds nothing to adopt and would
                # not spread them: spread now.
                self._spread_adopted(write, region, older_than)
            log.warning(
                "takeover_unresolved",
                dataset=write.dataset,
                region=region,
                pushed=pushed,
                adopted=adopted,
                rewound=rewound,
                unresolved=unresolved,
            )
            raise UnavailableError(
                f"the takeover pass of {write.dataset} over {region} could not decide "
                f"{len(unresolved)} of what that region holds (left as it is, the pass is "
                "retried): " + "; ".join(f"{k}: {why}" for k, why in sorted(unresolved.items()))
            )
        return pushed, adopted, rewound

    async def _settle_extra(
        self,
        write: CommittedWrite,
        region: str,
        address: str,
        key: str,
        shown: tuple[Version, str | None],
        ours: Version | None,
        older_than: HLC,
    ) -> tuple[int, int, Version | None]:
        """Adopt or rewind `shown` (a version and the set it was written in), the newest
        `region` holds of `key`, which this owner lacks: (adopted, rewound, what
        `region` holds of it afterwards). A rewind shows the version before it there,
        which may be another one this owner lacks (a deposed owner's earlier lone write,
        or an acked one): it is judged in turn, so the region is left showing nothing
        lone."""
        adopted = rewound = 0
        held: Version | None = shown[0]
        set_id = shown[1]
        for _step in range(REWINDS_PER_KEY):
            if held is None or not _extra(ours, held):
                break
            try:
                lone = held.hlc >= older_than and await self._held_nowhere_else(
                    write, region, key, held
                )
            except _UnresolvedError as exc:
                exc.rewound = rewound  # the versions after it, rewound by now
                raise
            if lone and held.is_tombstone and not self._delete_rewindable(held):
                # Lone, but another region may have forgotten a newer acked delete than
                # what a rewind would show here: left, and said.
                log.warning(
                    "takeover_stale_delete_left",
                    dataset=write.dataset,
                    key=key,
                    region=region,
                    version=held.hlc.text,
                    why="older than half the tombstone retention",
                )
                break
            if not lone:
                # Adopted: it may be an acked write this owner missed, held by a quorum
                # without us, whatever its HLC says of the two clocks (a new owner whose
                # clock is behind sees an old epoch's acked write as "newer").
                # With the set it was written in: a member adopted without it would
                # lose the protections of a set's members here and wherever this
                # owner pushes it next.
                if self.adopt is not None and await self.adopt(
                    write.dataset, key, held, region, address, set_id
                ):
                    adopted += 1
                break
            try:
                dropped, before = await self._rewind(write, region, address, key, held)
            except FencedError:
                raise
            except InvalidInputError as exc:
                # An agent that predates rewinding deletes refuses one: left as before.
                # A routed Rewind raises that refusal even when another agent of the
                # region dropped the version already, so the region is marked behind as
                # after a drop (a catch-up where nothing was dropped only costs a listing).
                self._mark_behind(write, region)
                log.warning(
                    "takeover_stale_delete_left",
                    dataset=write.dataset,
                    key=key,
                    region=region,
                    version=held.hlc.text,
                    why=str(exc),
                )
                break
            except MeridianError:
                # A routed Rewind that did not reach every agent may have dropped it where
                # it did ("dropped where it did"): marked behind as a drop is (below).
                self._mark_behind(write, region)
                raise
            if not dropped:
                # Listed there, yet dropped nowhere it was asked (an agent of that region
                # the call did not reach, or one that does not route it): not done, and
                # what it shows now proves nothing. The pass lists it again.
                raise _UnresolvedError(
                    f"{region} listed {key} at {held.hlc} but its rewind dropped nothing there",
                    rewound=rewound,
                )
            rewound += 1
            # Marked now, not by the caller once the key is settled: a later step of this
            # key (a proof, a rewind, an adoption) may fail, and the retried pass, which
            # may see nothing extra there any more, pushes none of this epoch's writes
            # the region answered "older" against the version just dropped (review).
            # A catch-up lists it afresh and keeps it out of acks until it lacks nothing.
            self._mark_behind(write, region)
            held = before
            # The version the rewind shows: its set is not in the answer (rare: asked).
            set_id = None
            if held is not None and not held.is_tombstone:
                set_id = await self._written_in(address, write.dataset, key, held.hlc)
        return adopted, rewound, held

    def _delete_rewindable(self, tombstone: Version) -> bool:
        """A lone delete is rewound only while no other region can have forgotten an
        acked delete of the key that is newer than what the rewind shows: while the
        tombstone is younger than half this store's tombstone retention (by its HLC's
        wall time), the regions' own tombstones are all still kept."""
        age_ms = self.store.clock.now().wall_ms - tombstone.hlc.wall_ms
        return age_ms < 500 * self.store.tombstone_retention_s

    async def _held_nowhere_else(
        self, write: CommittedWrite, region: str, key: str, version: Version
    ) -> bool:
        """Whether `region` alone holds `version` (or anything newer) of `key`, a put or a
        delete: every other copy region, this one included (each region's agents, by
        the routed listing), holds only older versions of it. Only such a version can
        never have been acked (an ack needs at least two regions), so only it may be
        rewound. A region that cannot answer for all its agents (one down, paused, a
        deadline passed) decides nothing either way: `_UnresolvedError`. Read as "held
        elsewhere" it was adopted, and a deposed owner's never-acked write, newer than
        what this epoch acked, was spread over it; read as "nowhere" (a listing that
        skipped the agent holding it) an acked write was rewound."""
        for other in (self.region, *push_targets(write.admitted.placement, self.region)):
            if other == region:
                continue
            try:
                address = await self._proof_address(other)
                held = await self._newest_at(address, write.dataset, key)
            except _OwnRegionPendingError:
                raise
            except MeridianError as exc:
                log.info(
                    "takeover_unproven",
                    dataset=write.dataset,
                    key=key,
                    region=other,
                    error=str(exc),
                )
                raise _UnresolvedError(
                    f"whether {other} holds {key} at {version.hlc} is unknown ({exc})"
                ) from exc
            if held is not None and held.hlc >= version.hlc:
                return False
        return True

    async def forgettable_deletes(
        self, dataset: str, placement: Placement, deletes: list[tuple[str, str]]
    ) -> set[str]:
        """The keys of `deletes` ((key, tombstone HLC text), each past the retention here)
        whose delete every copy region, this one included, shows and no agent there
        shows anything else: each agent of each region (the routed listing, `lowest`:
        the lowest of the agents' newest versions) holds that very delete or nothing
        of the key. Only then may the tombstone be forgotten (agents/daemon/expiry.py):
        an agent still showing an older put, one that missed the delete, would hand
        it to a takeover by a region that forgot the delete, as a write to adopt; and
        a newer version may be a deposed owner's lone write, which a takeover rewinds,
        showing the older put again. A region or key that cannot be proven (an agent
        down or departed, a deadline) keeps its tombstone until a later pass."""
        regions = copy_regions(placement)
        gate = asyncio.Semaphore(_PROOFS_IN_FLIGHT)

        async def why_kept(key: str, hlc: str) -> tuple[str, str, str] | None:
            """None when proven, else (what, region, detail)."""
            async with gate:
                for region in regions:
                    try:
                        address = await self.peers.address(region)
                        # The lowest and the highest of the agents' newest: both that
                        # delete, every agent holding the key shows it.
                        low = await self._newest_at(address, dataset, key, lowest=True)
                        high = await self._newest_at(address, dataset, key)
                    except MeridianError as exc:
                        return "unanswered", region, str(exc)
                    other = next(
                        (v for v in (low, high) if v is not None and v.hlc.text != hlc), None
                    )
                    if other is not None and other.hlc.text < hlc:
                        return "missed_delete", region, key  # until a catch-up brings it
                    if other is not None or (low is None) != (high is None):
                        # A newer write (maybe a lone one a takeover rewinds), or the
                        # region changing between the two listings.
                        return "other_shown", region, key
            return None

        reasons = await asyncio.gather(*(why_kept(key, hlc) for key, hlc in deletes))
        kept = [r for r in reasons if r is not None]
        if kept:
            # One line per dataset and batch, not per key: a region away for a day can
            # keep thousands of tombstones at every pass.
            counts: dict[str, dict[str, int]] = {}
            for what, region, _ in kept:
                counts.setdefault(what, {}).setdefault(region, 0)
                counts[what][region] += 1
            log.info(
                "tombstones_kept",
                dataset=dataset,
                kept=len(kept),
                of=len(deletes),
                **counts,
                example=f"{kept[0][0]} in {kept[0][1]}: {kept[0][2]}",
            )
        return {key for (key, _), why in zip(deletes, reasons, strict=True) if why is None}

    async def _proof_address(self, region: str) -> str:
        """An agent of `region` to ask for a proof. This agent's own region is asked too
        (its other agents), and at an agent's start, before its registration is in
        etcd, it has none: that is no doubt to adopt on (a deposed owner's lone write
        would be spread everywhere), only a wait, so the pass is retried."""
        try:
            return await self.peers.address(region)
        except MeridianError as exc:
            if region != self.region:
                raise
            raise _OwnRegionPendingError(
                f"this region {region} has no agent to ask yet ({exc}); the pass waits"
            ) from exc

    async def _newest_at(
        self, address: str, dataset: str, key: str, *, lowest: bool = False
    ) -> Version | None:
        """The newest version an agent's region holds of `key`, a tombstone included
        (None: nothing). A listing, not `Stat`: `Stat` answers "not found" for a delete
        (an acked delete held by two regions was once "proven" lone that way and
        rewound in both), and a routed listing asks every agent of the region:
        `complete`, so that one that does not answer fails the call instead of being
        skipped. `lowest`: of the agents' newest versions, the lowest, not the highest."""
        stub = self._stub(address)
        request = agent_pb2.ListRequest(
            dataset=dataset,
            prefix=key,
            page_size=1,
            include_deleted=True,
            complete=True,
            lowest=lowest,
        )
        try:
            page = await stub.List(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, address) from err
        if lowest and not page.lowest:
            raise UnavailableError(
                f"the agent at {address} does not list by the lowest version (it predates "
                "that): no proof until it is upgraded"
            )
        # The key itself sorts first among the keys it prefixes.
        for info in page.objects:
            if info.key == key:
                return version_from_wire(info.version, "ListResponse.objects.version")
        return None

    async def _adopt_set(
        self,
        write: CommittedWrite,
        region: str,
        address: str,
        older_than: HLC,
        local: Local,
    ) -> bool:
        """Adopt the set `region` shows (its newest complete one) when it is newer than the
        one this owner shows: an old epoch's acked set this owner missed, whose members
        alone the version pass would adopt (this region would go on showing the set
        before it, and no catch-up would ever spread it). The record is applied here
        first (visible once every member is stored), then its members are pulled at the
        set's versions, each stored for the set even under a newer put of its key. A
        set newer than the epoch's start that no other copy region shows was never
        acked: not adopted (said in the log). `region`'s set is read through the one
        agent at `address`, as is each other region's (`_set_nowhere_else`), which
        answers for every agent of its region (a routed GetSet,
        agents/routing/service.py): "not shown" there is retriable while one of them
        could not say."""
        theirs = await self._set_at(address, write.dataset, "latest")
        shown = local[1][0] if local[1] else None
        if theirs is not None and not self.alone_in_region():
            # A set stays on the agent of this region that took it: what the region
            # shows (a routed GetSet) is ours, as the versions are (`_takeover_once`).
            try:
                region_shows = await self._set_at(
                    await self._proof_address(self.region), write.dataset, "latest"
                )
            except MeridianError as exc:
                # One of its agents holds a set it cannot show yet (a checkpoint being
                # written): left for the retried pass, as any set not decided now.
                raise _UnresolvedError(
                    f"whether this region {self.region} shows a newer set is unknown ({exc})"
                ) from exc
            if region_shows is not None and (shown is None or region_shows.hlc > shown.hlc):
                shown = region_shows
        if theirs is None or (shown is not None and theirs.hlc <= shown.hlc):
            return False
        if theirs.hlc >= older_than and await self._set_nowhere_else(write, region, theirs):
            log.warning(
                "takeover_lone_set_left",
                dataset=write.dataset,
                set=theirs.set_id,
                region=region,
                hlc=theirs.hlc.text,
            )
            return False
        if self.adopt is None:
            return False
        if self.holding_sets is not None:
            await self.holding_sets()
        # The record first: a member older than its key's newest here (the next
        # checkpoint's put, written under this owner) is then stored for the set it
        # names (ObjectStore.wanted), where LWW alone would refuse it for good.
        verdict = await asyncio.to_thread(
            self.store.apply_set, write.dataset, theirs.set_id, theirs.hlc, theirs.members
        )
        pulled = False
        # A set this store judged older (superseded here) or different needs no member
        # (the version pass adopts those newer than what is held).
        wanted = theirs.members if verdict in (Verdict.APPLY, Verdict.SAME) else {}
        for key, hlc in sorted(wanted.items()):
            if await asyncio.to_thread(self._stored_here, write.dataset, key, hlc):
                continue
            member, _ = await self._stat_at(address, write.dataset, key, hlc)
            adopt = self.adopt(write.dataset, key, member, region, address, theirs.set_id)
            pulled = await adopt or pulled
        try:
            missing: list[str] | None = await asyncio.to_thread(
                self.store.missing_members, write.dataset, theirs.set_id
            )
        except NotFoundError:
            missing = None  # forgotten here since: superseded by a newer complete set
        log.info(
            "takeover_set_adopted",
            dataset=write.dataset,
            set=theirs.set_id,
            region=region,
            hlc=theirs.hlc.text,
            verdict=verdict.value,
            # A member that could not be pulled (or one superseded by a newer complete
            # set, which forgot this one): the set stays recorded but not shown here.
            missing=missing,
        )
        # Something new here (its passes over the other regions spread it); a set that
        # cannot be completed here counts once, not at every pass (no ping-pong).
        return pulled or verdict is Verdict.APPLY

    async def _set_nowhere_else(
        self, write: CommittedWrite, region: str, record: SetRecord
    ) -> bool:
        """Whether no copy region but `region` shows `record` (or a newer record of its
        id) complete: only such a set was never acked. A region that does not answer
        (or shows the set incomplete, which answers retriable too) decides nothing:
        `_UnresolvedError`, as for a version (`_held_nowhere_else`). The agent asked
        answers from every agent of its region (a routed `GetSet`). Module docstring."""
        for other in (self.region, *push_targets(write.admitted.placement, self.region)):
            if other == region:
                continue
            try:
                address = await self._proof_address(other)
                held = await self._set_at(address, write.dataset, record.set_id)
            except _OwnRegionPendingError:
                raise
            except MeridianError as exc:
                log.info(
                    "takeover_unproven",
                    dataset=write.dataset,
                    set=record.set_id,
                    region=other,
                    error=str(exc),
                )
                raise _UnresolvedError(
                    f"whether {other} shows set {record.set_id} at {record.hlc} is unknown ({exc})"
                ) from exc
            if held is not None and held.hlc >= record.hlc:
                return False
        return True

    async def _set_at(self, address: str, dataset: str, set_id: str) -> SetRecord | None:
        """A set as the agent at `address` shows it (complete), by id or "latest"; None:
        not known in its region (the agent asks the others: a routed `GetSet`)."""
        stub = self._stub(address)
        try:
            got = await stub.GetSet(
                agent_pb2.GetSetRequest(dataset=dataset, set=set_id), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise from_rpc_error(err, address) from err
        vs = version_set_from_wire(got.set, "GetSetResponse.set", stamped=True)
        assert vs.hlc is not None  # noqa: S101 - parsed with stamped=True
        members = {m.key: m.version for m in vs.members}
        return SetRecord(dataset, vs.id, vs.hlc, members, complete=True)

    async def _stat_at(
        self, address: str, dataset: str, key: str, hlc: HLC
    ) -> tuple[Version, str | None]:
        """The version `address` holds of `key` at `hlc`, and the set it was written in."""
        stub = self._stub(address)
        request = agent_pb2.StatRequest(dataset=dataset, key=key, version=hlc.text)
        try:
            got = await stub.Stat(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, address) from err
        version = version_from_wire(got.object.version, "StatResponse.object.version")
        return version, got.object.set if got.object.HasField("set") else None

    async def _written_in(self, address: str, dataset: str, key: str, hlc: HLC) -> str | None:
        """The set `address` says this version was written in; None when it says none or
        cannot say (the version is adopted all the same: only its set id is lost)."""
        try:
            return (await self._stat_at(address, dataset, key, hlc))[1]
        except MeridianError as exc:
            log.warning("takeover_set_id_unread", dataset=dataset, key=key, error=str(exc))
            return None

    def _stored_here(self, dataset: str, key: str, hlc: HLC) -> bool:
        try:
            return self.store.stat(dataset, key, hlc).state == "present"
        except MeridianError:
            return False

    async def _push_lacking(
        self,
        write: CommittedWrite,
        region: str,
        theirs: dict[str, Version],
        local: Local,
        older_than: HLC | None,
        rewound: set[str] | frozenset[str] = frozenset(),
    ) -> int:
        """Push what `region` (holding `theirs`) lacks of `local`, oldest first; the number
        pushed. `older_than`: only versions and sets older than it (a takeover pass
        leaves the writes of its own epoch to their own pushes, which it would only
        duplicate), but for the keys `rewound` there: their pushes of this epoch may
        have been answered "older" against the lone version just rewound, so nothing
        else would bring that region this owner's version."""
        ours, sets, members = local
        # The newest version of each key, and the members of the sets this region
        # shows (the newest complete set and any newer: older versions of their keys),
        # oldest first, so that the replica's newest equals ours and its sets complete.
        candidates = {(k, v.hlc): (k, v, s) for k, v, s in [*members, *ours]}
        wanted = sorted(
            (
                c
                for c in candidates.values()
                if _lacks(theirs.get(c[0]), c[1])
                and (older_than is None or c[1].hlc < older_than or c[0] in rewound)
            ),
            key=lambda kv: kv[1].hlc,
        )
        if older_than is not None:
            sets = [r for r in sets if r.hlc < older_than]
        for key, version, set_id in wanted:
            entry = CommittedWrite(
                write.admitted, write.dataset, key=key, version=version, set_id=set_id
            )
            await self._push(
                region, entry, version, self.timeout_s + version.size / self.min_rate_bps
            )
        for at in range(0, len(sets), MAX_SETS):
            page = sets[at : at + MAX_SETS]
            size = sum(map(self._members_size, page))
            await self._push_sets(region, write, page, self.timeout_s + size / self.min_rate_bps)
        return len(wanted) + len(sets)

    async def _rewind(
        self, write: CommittedWrite, region: str, address: str, key: str, version: Version
    ) -> tuple[bool, Version | None]:
        """Have `region` drop `version` of `key` (every agent of it: a routed Rewind); whether
        it was dropped there, and what the region holds of the key afterwards."""
        stub = self._stub(address)
        request = agent_pb2.RewindRequest(
            dataset=write.dataset,
            key=key,
            version=version_to_wire(version),
            epoch=write.admitted.epoch,
            origin_region=self.region,
        )
        try:
            resp = await stub.Rewind(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, f"{region} ({address})") from err
        log.info(
            "takeover_rewound",
            dataset=write.dataset,
            key=key,
            region=region,
            version=version.hlc.text,
            dropped=resp.dropped,
        )
        if not resp.HasField("newest"):
            return resp.dropped, None
        return resp.dropped, version_from_wire(resp.newest, "RewindResponse.newest")

    async def _rewind_own(self, write: CommittedWrite, fenced: FencedError) -> None:
        """A replica fenced this write (a newer epoch) and no region took it: it can never
        be acked, so this deposed owner drops it rather than keep a copy no owner has."""
        if write.version is None or write.key is None:
            return  # a set record: its members were each written (and fenced) alone
        try:
            dropped = await asyncio.to_thread(
                self.store.rewind, write.dataset, write.key, write.version
            )
        except MeridianError as exc:
            log.warning("rewind_failed", dataset=write.dataset, key=write.key, error=str(exc))
            return
        log.warning(
            "critical_write_rewound",
            dataset=write.dataset,
            key=write.key,
            version=write.version.hlc.text,
            dropped=dropped,
            reason=str(fenced),
        )

    def _local(self, dataset: str) -> Local:
        """This store's newest version of each key, its newest complete set (what a
        reader here is shown; older ones are superseded and their members may be
        pruned), and the versions that set names."""
        newest: list[Held] = []
        cursor: str | None = None
        for _page in range(1_000_000):  # bounded: a cursor that never ends is a bug
            page = self.store.list_objects(dataset, cursor=cursor, include_deleted=True)
            newest += [(s.key, s.version, s.set_id) for s in page.items]
            cursor = page.cursor
            if cursor is None:
                break
        shown = [r for r in self.store.list_sets(dataset) if r.complete]  # newest first
        latest = shown[:1]  # older complete sets: superseded, their members may go
        members: list[Held] = []
        for record in latest:
            for key, hlc in record.members.items():
                with contextlib.suppress(MeridianError):
                    stored = self.store.stat(dataset, key, hlc)
                    members.append((key, stored.version, record.set_id))
        return newest, latest, members

    async def _listing(
        self,
        address: str,
        dataset: str,
        *,
        complete: bool = False,
        sets: dict[str, str] | None = None,
    ) -> dict[str, Version]:
        """What the region of the agent at `address` holds of `dataset` (newest of each key,
        tombstones included). `complete`: fail rather than skip an agent of a region
        of several that does not answer (a catch-up may list partially: it then pushes
        more than needed, which the replica answers "older"). `sets`: filled with the
        set each listed version was written in, where it was written in one."""
        stub = self._stub(address)
        held: dict[str, Version] = {}
        token = ""
        for _page in range(1_000_000):
            try:
                page = await stub.List(
                    agent_pb2.ListRequest(
                        dataset=dataset,
                        page_token=token,
                        include_deleted=True,
                        page_size=1000,
                        complete=complete,
                    ),
                    timeout=self.timeout_s,
                )
            except grpc.aio.AioRpcError as err:
                raise from_rpc_error(err, address) from err
            for info in page.objects:
                held[info.key] = version_from_wire(info.version, "ListResponse.objects.version")
                if sets is not None and info.HasField("set"):
                    sets[info.key] = info.set
            token = page.next_page_token
            if not token:
                break
        return held

    def _stub(self, address: str) -> agent_pb2_grpc.AgentAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = agent_pb2_grpc.AgentStub(self._channel(address))
        return stub

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    def _ordered(
        self, write: CommittedWrite, region: str, push: Awaitable[str]
    ) -> asyncio.Future[str]:
        """`push` to `region` as a future that succeeds only once every push to `region`
        begun before it has succeeded too: a region counts toward an ack only when it
        holds every earlier write pushed to it (pushes run at once and may end out of
        order). An earlier push that fails fails this one. Callbacks, not a task: two
        of these are made for every acked write.

        A push that fails (not fenced) marks its region behind the moment it fails,
        before its future ends: a push begun after it then finds the
        region behind and is not counted. (Marked when its write's wait ended, a later
        write's push that succeeded meanwhile counted a region lacking this one.)"""
        dataset = write.dataset
        lane = (dataset, region)
        # Settled once every push begun before this one has ended (its result: the first
        # failure among them, or None): waiting for it alone waits for them all (each
        # write waiting for every running push cost the owner O(writers) per write).
        earlier = self._settled.get(lane)
        if earlier is not None and earlier.done():
            # All ended (its callback not yet run): nothing to wait for; one that failed
            # marked the region behind as it failed (`_push_ended`).
            earlier = None
        self._push_seq += 1
        raw = asyncio.ensure_future(push)
        raw.add_done_callback(functools.partial(self._push_ended, write, region))
        # Held until it ends, and ended by close() (a write's `ordered` future may end
        # before its push does: cancelled, or failed by an earlier push).
        self._pushes.add(raw)
        raw.add_done_callback(self._pushes.discard)
        settled = _settled_after(raw, earlier, self._push_seq)
        self._settled[lane] = settled
        settled.add_done_callback(functools.partial(self._lane_settled, lane))
        if earlier is None:
            return raw
        before = earlier
        ordered: asyncio.Future[str] = raw.get_loop().create_future()

        def after_earlier(_: object) -> None:
            if ordered.done():
                return
            if before.cancelled():
                ordered.cancel()
                return
            failed = before.result()
            if failed is not None and failed[0] > self._healed.get(lane, 0):
                ordered.set_exception(
                    EarlierPushError(
                        f"an earlier push to {region} of {dataset} failed ({failed[1]}): it "
                        "may lack that version"
                    )
                )
            else:
                ordered.set_result(raw.result())

        def after_raw(_: object) -> None:
            if ordered.done():
                return
            if raw.cancelled():
                ordered.cancel()
            elif (exc := raw.exception()) is not None:
                ordered.set_exception(exc)  # its own failure fails it at once
            elif before.done():
                after_earlier(before)
            else:
                # Never cancelled by this one's end: later pushes wait on it too.
                before.add_done_callback(after_earlier)

        # Nothing cancels `ordered` but close(), which cancels `raw` itself (`_pushes`).
        raw.add_done_callback(after_raw)
        return ordered

    def _lane_settled(
        self, lane: tuple[str, str], settled: asyncio.Future[_Failure | None]
    ) -> None:
        if self._settled.get(lane) is settled:
            del self._settled[lane]

    def _push_ended(self, write: CommittedWrite, region: str, raw: asyncio.Future[str]) -> None:
        if raw.cancelled():
            return
        exc = raw.exception()
        if exc is not None and not isinstance(exc, FencedError):
            self._mark_behind(write, region)

    def _finished(self, region: str, push: asyncio.Future[str]) -> None:
        """A push still running when its write was answered has ended (a failed one
        marked its region behind as it failed: `_ordered`)."""
        self._background.discard(push)
        if push.cancelled():
            return
        exc = push.exception()
        if exc is not None:
            log.warning("replica_push_failed_after_ack", region=region, error=str(exc))

    async def _fenced_answer(
        self, write: CommittedWrite, what: str, fenced: FencedError
    ) -> MeridianError:
        """What to answer when a replica fenced `write`: its etcd names a newer epoch.
        That is a loss of ownership (`fenced`, not retriable) unless etcd, read now, still
        names this region as the owner at a newer epoch: a re-claim by this region that
        the ownership watch had not delivered when the write was admitted (at the old
        epoch, the client stating none). Then the answer is retriable: the retry is
        admitted at the new epoch (the read told the fence). The write is not pushed
        again at the new epoch: it was admitted under the old one, and another region
        may have owned the dataset between the two."""
        if self.owner_now is None:
            return fenced
        try:
            owner = await self.owner_now(write.dataset)
        except MeridianError as exc:
            return UnavailableError(
                f"{what} was refused by a replica as stale ({fenced}), and etcd cannot say "
                f"now whether this region still owns {write.dataset} ({exc}); retry the write"
            )
        if owner is not None and _handed_over(owner, self.region, write.admitted.epoch):
            # A switchover or drain from this region ended the write's epoch while it was
            # pushed (the probe waits only for acked writes): a write during a handover
            # is refused retriable (the contract), and a writer told so finds the new
            # owner. Not acked anywhere, it is rewound here as a fenced write is.
            log.info(
                "critical_write_handed_over",
                dataset=write.dataset,
                what=what,
                epoch=write.admitted.epoch,
                owner=owner.region,
                kind=owner.moved_by,
            )
            return UnavailableError(
                f"{what} was admitted at epoch {write.admitted.epoch}, but a {owner.moved_by} "
                f"handed {write.dataset} over to {owner.region} (epoch {owner.epoch}) while "
                "it was replicated; it was not acked; retry the write (against the new owner)"
            )
        if owner is None or owner.region != self.region or owner.epoch <= write.admitted.epoch:
            return fenced
        log.info(
            "critical_write_epoch_renewed",
            dataset=write.dataset,
            what=what,
            epoch=write.admitted.epoch,
            current=owner.epoch,
        )
        return UnavailableError(
            f"{what} was admitted at epoch {write.admitted.epoch}, but this region "
            f"{self.region} has since re-claimed {write.dataset} at epoch {owner.epoch}; "
            "nothing was acked; retry the write (it is admitted at the new epoch)"
        )

    async def _push(
        self, region: str, write: CommittedWrite, version: Version, deadline_s: float
    ) -> str:
        """Push one version to `region`: as a delta over a basis it should hold when that
        pays (delta_push.py), whole otherwise or when it does not hold that basis."""
        try:
            return await self._push_to(region, write, version, deadline_s)
        except BaseException:
            self.peers.forget(region)  # the next push reads its address from etcd again
            raise

    async def _push_to(
        self, region: str, write: CommittedWrite, version: Version, deadline_s: float
    ) -> str:
        """The push of `_push`, all of it (a delta answered `basis_missing`, then the
        version whole) within `deadline_s`: the whole call gets only what the delta
        left of it (given the full deadline again, a replica slow to say it lacks the
        basis stretched the push to twice its bound)."""
        until = time.monotonic() + deadline_s
        address = await self.peers.address(region)
        stub = self._stub(address)
        key = write.key or ""
        header = self._header(write, version)
        known = self.bases.get(region, write.dataset, key)
        basis = None
        inline = _inline(write, version) is not None  # small, in memory, maybe not committed
        if (
            self.deltas
            and not inline
            and not version.is_tombstone
            and version.size >= DELTA_MIN_BYTES
            and not self.bases.lacks_basis(region, write.dataset, key)
        ):
            # (choose_basis says None below the threshold: no thread hop for it.)
            basis = await asyncio.to_thread(
                choose_basis, self.store, write.dataset, key, version, known
            )
        if basis is not None and basis.digest is not None:
            header.basis.CopyFrom(agent_pb2.Basis(version=basis.hlc.text, digest=basis.digest.text))
            frames = self._delta_frames(header, write, version, basis)
            left = self._left(until, deadline_s, f"{write.dataset}/{key}", version, region)
            resp = await self._replicate_call(stub, header, frames, left, region, address)
            _check_region(resp.region, region, address)
            if not resp.basis_missing:
                await self._check_newer(region, write.dataset, key, version, resp.version)
                self._committed(region, write.dataset, key, resp)
                return region
            log.info("replica_basis_missing", dataset=write.dataset, key=key, region=region)
            self.bases.basis_missing(region, write.dataset, key)
            header.ClearField("basis")
            if until - time.monotonic() <= 0:
                raise UnavailableError(
                    f"the push of {write.dataset}/{key} at {version.hlc} to {region} "
                    f"({address}) was answered basis_missing with nothing left of its "
                    f"{deadline_s:.1f} s deadline to send the version whole; retry the push"
                )
        left = self._left(until, deadline_s, f"{write.dataset}/{key}", version, region)
        resp = await self._replicate_call(
            stub, header, self._frames(header, write, version), left, region, address
        )
        _check_region(resp.region, region, address)
        await self._check_newer(region, write.dataset, key, version, resp.version)
        self._committed(region, write.dataset, key, resp)
        return region

    @staticmethod
    def _left(until: float, deadline_s: float, what: str, version: Version, region: str) -> float:
        """What is left of a push's deadline (`until`, monotonic) for its next call: the
        address read, the choice of a basis and a refused delta came out of it, so the
        whole push stays within `deadline_s`."""
        left = until - time.monotonic()
        if left <= 0:
            raise UnavailableError(
                f"the push of {what} at {version.hlc} to {region} used up its "
                f"{deadline_s:.1f} s deadline before its call was made; retry the push"
            )
        return left

    async def _check_newer(
        self, region: str, dataset: str, key: str, pushed: Version, wire: types_pb2.Version
    ) -> None:
        """A replica that answers "older" (it holds a newer version of the key) counts as
        holding the push only when that newer version is this owner's (made in this
        region: a later write of ours whose push came first) or held here. Any other is
        another owner's write this owner does not know: a deposed owner's lone one,
        which that owner or a takeover pass rewinds (then the replica shows neither it
        nor ours, and an ack counted there rested on a copy that is gone), or an acked
        one the takeover pass has yet to adopt. Raised (retriable): the replica is
        marked behind, and the ack needs the other regions."""
        if not wire.hlc:
            return  # no version named (an older agent), as before
        if wire.hlc == pushed.hlc.text:  # HLC text sorts: no parse per push
            if wire.digest and pushed.digest is not None and wire.digest != str(pushed.digest):
                # A collision (same HLC, other bytes): that region does not hold this
                # write, and LWW keeps what it holds, so no catch-up can bring it
                # (`_lacks` leaves it out). Not counted toward the ack.
                raise UnavailableError(
                    f"{region} holds another version of {dataset}/{key} at {pushed.hlc} "
                    "(same HLC, other bytes): not counted toward the ack"
                )
            return  # committed, or the same version held
        if wire.hlc < pushed.hlc.text:
            # Newest there is older than the push: it was not stored (an answer no
            # replica should give; counted, an ack would rest on a copy that is not).
            raise UnavailableError(
                f"{region} answered the push of {dataset}/{key} at {pushed.hlc} with an "
                f"older version held ({wire.hlc}): it did not store it"
            )
        try:
            held = version_from_wire(wire, "ReplicateResponse.version")
        except MeridianError:
            return
        if held.hlc <= pushed.hlc or held.hlc.region == self.region:
            return
        if await asyncio.to_thread(self._known_here, dataset, key, held.hlc):
            return
        log.warning(
            "replica_holds_unknown_newer",
            dataset=dataset,
            key=key,
            region=region,
            pushed=pushed.hlc.text,
            held=held.hlc.text,
        )
        raise UnavailableError(
            f"{region} answered the push of {dataset}/{key} at {pushed.hlc} with a newer "
            f"version {held.hlc} that this owner does not hold (another owner's write, maybe "
            "never acked): not counted toward the ack"
        )

    def _known_here(self, dataset: str, key: str, hlc: HLC) -> bool:
        try:
            self.store.stat(dataset, key, hlc, include_deleted=True)
        except MeridianError:
            return False
        return True

    async def _replicate_call(
        self,
        stub: agent_pb2_grpc.AgentAsyncStub,
        header: agent_pb2.ReplicateHeader,
        frames: AsyncGenerator[agent_pb2.ReplicateRequest],
        deadline_s: float,
        region: str,
        address: str,
    ) -> agent_pb2.ReplicateResponse:
        until = time.monotonic() + deadline_s
        try:
            return await stub.Replicate(frames, timeout=deadline_s)
        except grpc.aio.AioRpcError as err:
            if core_internal(err):
                return await self._early_answer(stub, header, region, address, until)
            raise from_rpc_error(err, f"{region} ({address})") from err
        finally:
            # A replica answering early (basis_missing, a refusal) leaves the frames
            # unread: close them, which stops the engine's thread. While grpc's own
            # task is still inside them they cannot be closed from here ("already
            # running"): that task is cancelled as the call ends, and the generator
            # is finalised (closed) by the loop then.
            with contextlib.suppress(RuntimeError):
                await frames.aclose()

    async def _early_answer(
        self,
        stub: agent_pb2_grpc.AgentAsyncStub,
        header: agent_pb2.ReplicateHeader,
        region: str,
        address: str,
        until: float,
    ) -> agent_pb2.ReplicateResponse:
        """A push ended by grpc's INTERNAL in place of the replica's early status
        (early_status.py): asked again with the header alone, up to `EARLY_ASKS` times
        while the same bug hides the answer and within what is left of the push's
        deadline (`until`, monotonic; never more than `timeout_s`): the replica's real
        answer (its refusal raised: a fence is then a `FencedError`, a handover
        retriable), or a retriable error when it admits the header now (the early end
        was not a refusal; nothing of this push was committed there) or every ask was
        hidden or the deadline passed. One ask was not enough: the bug hides a fence
        twice in a row often enough that a deposed owner, given only a retriable
        error, kept its write and never rewound it. Hidden on every ask, the fence is
        read from etcd instead (`_hidden_fence`): a deposed owner is still told it is
        fenced, and rewinds its write as for a fence the replica's answer showed."""
        where = f"{region} ({address})"
        what = f"{header.dataset}/{header.key} at {header.version.hlc}"
        left = min(until - time.monotonic(), self.timeout_s)
        if left <= 0:
            fence = await self._hidden_fence(header, where, what, until)
            if fence is not None:
                raise fence
            raise UnavailableError(
                f"{where} ended the push of {what} early and its reason was lost "
                f"(grpc/grpc#36066); no time is left of the push's deadline to ask again; "
                f"retry the push"
            )
        try:
            response = await header_alone(stub, header, timeout_s=left, attempts=EARLY_ASKS)
        except grpc.aio.AioRpcError as err:
            found = from_rpc_error(err, where)
            hidden = core_internal(err)
            if hidden or isinstance(found, (ShortStreamError, DigestMismatchError)):
                log.warning("replicate_early_end_unexplained", region=region, what=what)
                fence = await self._hidden_fence(header, where, what, until) if hidden else None
                if fence is not None:
                    raise fence from err
                raise UnavailableError(
                    f"{where} ended the push of {what} early and its reason was lost "
                    f"(grpc/grpc#36066); asked again with the header alone it gives none "
                    f"({found}); retry the push"
                ) from err
            log.info(
                "replicate_refusal_recovered",
                region=region,
                what=what,
                error_class=type(found).__name__,
                error=str(found),
            )
            raise found from err
        log.info("replicate_early_answer_recovered", region=region, what=what)
        return response

    async def _hidden_fence(
        self, header: agent_pb2.ReplicateHeader, where: str, what: str, until: float
    ) -> StaleEpochError | None:
        """The fence a replica's answer may have been when the bug hid it on every ask,
        read from etcd now (`owner_now`): a `StaleEpochError` when etcd names another
        owner region, or a newer epoch, than the write was admitted at (`header.epoch`,
        the write's `admitted.epoch`), so this owner was deposed and the write can never
        be acked; None (the answer stays retriable) when etcd still names this region at
        that epoch, names no owner, or cannot answer: nothing then says the replica
        fenced it, and a retry is admitted against etcd again; None too when a planned
        handover (switchover, drain) from this region ended that epoch: a write during
        a handover is refused retriable. (Left retriable, a
        deposed owner kept its write standing and never rewound it.) The read gets what
        is left of the push's deadline (`until`, monotonic), at least
        `HIDDEN_FENCE_READ_S`."""
        if self.owner_now is None:
            return None
        bound = max(until - time.monotonic(), HIDDEN_FENCE_READ_S)
        try:
            async with asyncio.timeout(bound):
                owner = await self.owner_now(header.dataset)
        except TimeoutError:
            log.warning(
                "replicate_hidden_fence_unread", dataset=header.dataset, what=what, bound_s=bound
            )
            return None
        except MeridianError as exc:
            log.warning(
                "replicate_hidden_fence_unread", dataset=header.dataset, what=what, error=str(exc)
            )
            return None
        if owner is None or (owner.region == self.region and owner.epoch <= header.epoch):
            return None
        if _handed_over(owner, self.region, header.epoch):
            # A planned handover from this region ended the write's epoch: the replica
            # froze it for the handover (retriable) as likely as it fenced it after the
            # move, and a writer told "retry" finds the new owner; a deposed owner's
            # fence is a failover's (the contract: a handover retriable, a stale epoch
            # not). The write is then left as a refusal of the handover leaves it.
            log.info(
                "replicate_hidden_handover",
                dataset=header.dataset,
                what=what,
                epoch=header.epoch,
                owner=owner.region,
                kind=owner.moved_by,
            )
            return None
        log.warning(
            "replicate_hidden_fence_read",
            dataset=header.dataset,
            what=what,
            epoch=header.epoch,
            owner=owner.region,
            current=owner.epoch,
        )
        return StaleEpochError(
            f"{where} ended the push of {what} early and grpc/grpc#36066 hid its reason on "
            f"every ask; etcd names {owner.region} the owner of {header.dataset} at epoch "
            f"{owner.epoch}, and this write was admitted in {self.region} at epoch "
            f"{header.epoch}: this owner was deposed (fenced)"
        )

    def _committed(
        self, region: str, dataset: str, key: str, resp: agent_pb2.ReplicateResponse
    ) -> None:
        with contextlib.suppress(MeridianError):
            newest = version_from_wire(resp.version, "ReplicateResponse.version")
            if not newest.is_tombstone:
                self.bases.committed(region, dataset, key, newest)

    async def _frames(
        self, header: agent_pb2.ReplicateHeader, write: CommittedWrite, version: Version
    ) -> AsyncGenerator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)
        if version.is_tombstone:
            return
        data = _inline(write, version)
        if data is not None:
            if data:
                yield agent_pb2.ReplicateRequest(chunk=data)
            return
        if version.size <= CHUNK_BYTES:
            # One chunk: opened and read in one thread hop, not two.
            chunk = await asyncio.to_thread(
                self.store.read_bytes, write.dataset, write.key or "", version.hlc.text
            )
            if chunk:
                yield agent_pb2.ReplicateRequest(chunk=chunk)
            return
        reader = await open_in_thread(
            functools.partial(self.store.open, write.dataset, write.key or "", version.hlc.text)
        )
        try:
            while chunk := await asyncio.to_thread(reader.read, CHUNK_BYTES):
                yield agent_pb2.ReplicateRequest(chunk=chunk)
        finally:
            reader.close()

    async def _delta_frames(
        self,
        header: agent_pb2.ReplicateHeader,
        write: CommittedWrite,
        version: Version,
        basis: Version,
    ) -> AsyncGenerator[agent_pb2.ReplicateRequest]:
        yield agent_pb2.ReplicateRequest(header=header)
        chunks = delta_frames(
            self.store, write.dataset, write.key or "", version, basis, threads=self.delta_threads
        )
        try:
            async for chunk in chunks:
                yield agent_pb2.ReplicateRequest(delta=chunk)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    def took_over(self, admitted: Admitted, dataset: str, since: HLC) -> None:
        """This region was named the dataset's owner at `admitted.epoch` (the agent's
        ownership watch, or its start): the takeover pass begins at once, not at the
        epoch's first write, which may never come (chaos scenario 10: a region that
        took a dataset back without writing left a replica lacking an acked write).
        `since`: this clock's HLC now, before any write of the epoch."""
        if not admitted.critical or self._reconciled.get(dataset, 0) >= admitted.epoch:
            return
        write = CommittedWrite(admitted, dataset)
        latest = self._latest.get(dataset)
        if latest is None or latest.admitted.epoch <= admitted.epoch:
            self._latest[dataset] = write  # what catch-ups still running push at now
        self._reconciled[dataset] = admitted.epoch
        log.info("takeover_started", dataset=dataset, epoch=admitted.epoch)
        for region in push_targets(admitted.placement, self.region):
            self._start_pass(write, region, since)

    def _reconcile_after_takeover(self, write: CommittedWrite) -> None:
        """On this owner's first write at a new epoch, bring every other copy region up
        to what this region holds. A replica that was cut off while an earlier owner
        wrote (acked by the others) lacks those versions, and no push of ours fails to
        tell us so: its pushes of new writes succeed. Off the ack path: the pass marks
        the region behind only where it rewinds a version there (`_settle_extra`)."""
        epoch = write.admitted.epoch
        if self._reconciled.get(write.dataset, 0) >= epoch:
            return
        first = write.version or write.set_record
        if first is None:
            return
        self._reconciled[write.dataset] = epoch
        for region in push_targets(write.admitted.placement, self.region):
            self._start_pass(write, region, first.hlc)

    def _start_pass(self, write: CommittedWrite, region: str, older_than: HLC) -> None:
        """One pass per (dataset, region) at a time: asked again while one runs, it runs
        once more after it (with the newest epoch's write asked for), never beside it."""
        pair = (write.dataset, region)
        if pair in self._passes:
            queued = self._pass_again.get(pair)
            if queued is None or queued[0].admitted.epoch <= write.admitted.epoch:
                self._pass_again[pair] = (write, older_than)
            return
        task = asyncio.create_task(
            self._reconcile(write, region, older_than),
            name=f"takeover pass {write.dataset} {region}",
        )
        self._passes[pair] = task
        self._reconciles.add(task)
        task.add_done_callback(functools.partial(self._pass_ended, pair))

    def _pass_ended(self, pair: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._reconciles.discard(task)
        self._passes.pop(pair, None)
        queued = self._pass_again.pop(pair, None)
        if queued is not None and not task.cancelled():
            self._start_pass(queued[0], pair[1], queued[1])

    async def _reconcile(self, write: CommittedWrite, region: str, older_than: HLC) -> None:
        async def once() -> tuple[int, int, int] | None:
            if self._reconciled.get(write.dataset) != write.admitted.epoch:
                return None  # a newer epoch of ours started its own pass
            latest = self._latest.get(write.dataset, write)
            # The newest write's placement only, not the policy view (`_placed_away`):
            # a pass adopts acked writes the region may be the last to hold, so a quiet
            # dataset's pass goes on until it ends or a write says the copy moved.
            if region not in push_targets(latest.admitted.placement, self.region):
                return None
            # Bounded: an agent starting as the owner of many datasets begins a pass per
            # dataset and region at once; a few list and push at a time.
            async with self._pass_gate:
                return await self._takeover_once(write, region, older_than)

        try:
            done = await self._retried(
                "takeover_pass_retry", write.dataset, region, once, TAKEOVER_ATTEMPTS
            )
        except FencedError:
            return  # no longer the owner: the new one runs its own pass
        except MeridianError as exc:
            log.warning(
                "takeover_pass_gave_up", dataset=write.dataset, region=region, error=str(exc)
            )
            return
        if done is None:
            return
        pushed, adopted, rewound = done
        log.info(
            "takeover_pass_done",
            dataset=write.dataset,
            region=region,
            pushed=pushed,
            adopted=adopted,
            rewound=rewound,
        )
        if adopted:
            self._spread_adopted(write, region, older_than)

    def _spread_adopted(self, write: CommittedWrite, region: str, older_than: HLC) -> None:
        """What came from `region` goes to the others too (their passes may be over)."""
        for other in push_targets(write.admitted.placement, self.region):
            if other != region:
                self._start_pass(write, other, older_than)

    async def close(self) -> None:
        """Cancel pushes and catch-ups still running and close the channels."""
        tasks: list[asyncio.Future[Any]] = [
            *self._background,
            *self._pushes,
            *self._behind.values(),
            *self._reconciles,
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for lane in self._lanes.values():
            await lane.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


# A failed push of a lane: its number (`SyncReplication._push_seq`) and its error.
_Failure = tuple[int, BaseException]


def _settled_after(
    raw: asyncio.Future[str], earlier: asyncio.Future[_Failure | None] | None, seq: int
) -> asyncio.Future[_Failure | None]:
    """A future settled once `raw` (push number `seq`) and `earlier` (the pushes before
    it) have both ended, whichever ends first: the newest failure of the lane (raw's,
    then earlier's: a heal that covers it covers every older one), or None. Callbacks,
    not a task: one of these is made per push of every write."""
    settled: asyncio.Future[_Failure | None] = raw.get_loop().create_future()
    left = [1 if earlier is None else 2]

    def ended(_: object) -> None:
        left[0] -= 1
        if left[0] or settled.done():
            return
        own = CancelledPushError("cancelled") if raw.cancelled() else raw.exception()
        if own is not None:
            settled.set_result((seq, own))
        else:
            settled.set_result(earlier.result() if earlier is not None else None)

    raw.add_done_callback(ended)
    if earlier is not None:
        earlier.add_done_callback(ended)
    return settled


class CancelledPushError(UnavailableError):
    """A push cancelled before it ended (the agent closing): its version may be missing."""


class EarlierPushError(UnavailableError):
    """A push committed, but one begun before it to the same region failed: that region
    may lack the earlier version, so it does not count toward this write's ack."""


class _UnresolvedError(UnavailableError):
    """A version (or set) a takeover pass could not decide on: a proof that could not ask
    every agent of a region, or a rewind that dropped nothing where it was listed. It
    is left as it is, and the pass is retried. `rewound`: versions of the key after it
    that were rewound before it was met."""

    def __init__(self, message: str, *, rewound: int = 0) -> None:
        super().__init__(message)
        self.rewound = rewound


class _OwnRegionPendingError(UnavailableError):
    """A proof needs this agent's own region's agents, and none is registered yet (the
    agent is starting): the takeover pass is retried, never decided on that doubt."""


def _inline(write: CommittedWrite, version: Version) -> bytes | None:
    """The bytes of `version` as the client sent them (a small Put), when `write` is
    that version's own write; None: read them from the store."""
    return write.data if write.version == version else None


def _check_region(answered: str, region: str, address: str) -> None:
    """A copy counts for `region` only when an agent of `region` committed it: an address
    reused from an earlier read may by now belong to another region's agent."""
    if answered and answered != region:
        raise UnavailableError(
            f"{address} answered as an agent of {answered}, not of {region}: its address "
            "changed hands; the push is not counted"
        )


def _extra(ours: Version | None, theirs: Version) -> bool:
    """Whether a replica's newest `theirs` is a version this owner (newest `ours`) lacks:
    newer than ours, or held where we hold nothing (the same HLC with other bytes is an
    HLC collision, left as LWW leaves it)."""
    return ours is None or theirs.hlc > ours.hlc


def _lacks(held: Version | None, version: Version) -> bool:
    """Whether a replica whose newest is `held` lacks `version` (holds an older one). The
    same HLC with other bytes is a collision LWW leaves as it is (`_extra`): pushed, the
    replica keeps its own, and a catch-up pushing it would never end."""
    if held is None:
        return True
    return held.hlc < version.hlc
