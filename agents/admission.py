"""Admission at the agent's door: residency for every copy, fencing for critical writes.

Every byte an agent stores or sends passes here first (spec/dataplane.md, *Residency*
and *Classes*), and every check fails closed:

* **Governed.** The dataset's placement comes from the applied policy (a
  `PolicySource`, the etcd-watched `PolicyView` in the daemon). No policy, or none
  that places the dataset, or a region the topology lacks: `NotGovernedError`
  (UNAVAILABLE, retriable), never "admitted by default".
* **Residency.** A region holds a copy only if its jurisdiction is in the
  dataset's residency: the receiver checks itself (`admit_store`), the sender the
  receiver (`admit_send`). A refusal is `ResidencyError` (PERMISSION_DENIED, not
  retried), counted in `meridian_residency_refused_total{dataset,direction}` and
  logged.
* **Fencing** (critical datasets). A client write (`admit_write`) is accepted only
  by an agent of the owner region, at the owner's current epoch, while no handover
  is marked. The owner record is asked of an `OwnerSource` that answers from etcd
  state no older than its bound (and raises `UnavailableError` when etcd cannot
  say): the fence alone learns epochs from a watch, and a watch that lags would let
  a stale epoch through just after a handover committed. A write without an epoch
  gets the owner's current one attached (spec/cli.md); a stated epoch must be the
  current one. A pushed copy (`admit_replica`) goes through the `FencedResource`,
  which refuses an epoch older than the newest seen and every write while the
  dataset hands over, but for the owner's copies at its epoch to the handover's
  target (`_through_handover`). Stale epochs and handovers are counted and logged.

**A new owner's listing** (`settle_for_listing`). A replica reads etcd's owner record
just before it commits a pushed copy, and the commit follows the read: a failover
can come between them. A new owner's takeover pass that listed the replica then (not
the copy yet) would miss a copy the replica commits and acks a moment later for the
deposed owner (acked there with its own copy: an acked write the new owner never
holds). So a complete listing first reads the owner record (the fence then refuses
the old epoch at every later check) and waits for the copies of the dataset already
past their own read (`receiving`), which it then lists.

A dataset the policy's publish did not list but its rules place (`ckpt/run-7`,
first written after the apply) is announced once through the optional `announce`
port (`/meridian/datasets/`), so that controllers claim and fail it over; until
its home region's controller has claimed a critical one, its writes are refused
as not yet owned (retriable).

The sources are ports (Protocols below) so that tests build an `Admission` from an
in-memory policy and owners (tests/fakes/owners.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NoReturn, Protocol

from agents.errors import NotGovernedError, NotOwnerError, ResidencyError
from agents.metrics import AgentMetrics
from controlplane.coordination.protocols.fencing import (
    DatasetHandingOverError,
    FencedResource,
    StaleEpochError,
)
from controlplane.domain.placement import Placement
from controlplane.errors import FencedError, InvalidInputError, MeridianError, NotFoundError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy, NoPolicyError

log = get_logger("meridian.agent.admission")

Direction = Literal["receive", "send"]
# `announce(dataset)`: record in etcd that a dataset the publish did not list exists
# (the daemon binds controlplane.coordination.protocols.datasets.announce to it).
Announcer = Callable[[str], Awaitable[object]]
# `fresh_owner(dataset)`: the owner record as etcd holds it now, from a read begun after
# the call or anything newer known by then (the daemon binds `EtcdOwners.owner_now`); a
# replica decides on it before acking a pushed copy.
FreshOwner = Callable[[str], Awaitable["OwnerRecord | None"]]
_PLACED_MAX = 65_536


class PolicySource(Protocol):
    """The applied policy (`controlplane.policy.current.PolicyView` satisfies it)."""

    def require(self) -> CompiledPolicy:
        """The current snapshot; `NoPolicyError` (retriable) when none is published."""
        ...


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """Who owns a critical dataset, at which epoch, and whether a handover is marked
    (and to which region, when known)."""

    dataset: str
    region: str
    epoch: int
    handing_over: bool = False
    handover_to: str | None = None
    # The etcd revision it is as of, when known (for the fence's ordering; two records
    # saying the same are equal whenever they were read).
    revision: int | None = field(default=None, compare=False)
    # How ownership last moved, when it moved (the owner record's move facts): its kind
    # ("switchover", "drain", "failover", "automatic"), the region it left and that
    # region's epoch. A write admitted at that epoch there was ended by this move.
    moved_by: str | None = field(default=None, compare=False)
    moved_from: str | None = field(default=None, compare=False)
    epoch_before: int = field(default=0, compare=False)


class OwnerSource(Protocol):
    """Owners and epochs of critical datasets, as etcd holds them.

    Contract: `owner` answers from state read from etcd no longer ago than the
    source's freshness bound (re-reading when its cache is older), None when the
    dataset has no owner record, and raises `UnavailableError` (retriable) when it
    cannot say. `known` answers from what was last read or watched, without I/O
    (None when nothing is known)."""

    async def owner(self, dataset: str) -> OwnerRecord | None: ...

    def known(self, dataset: str) -> OwnerRecord | None: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    """A client write let in: its placement, the epoch it is written at (0 for a
    standard dataset) and the policy revision that decided it."""

    placement: Placement
    epoch: int
    policy_revision: int

    @property
    def critical(self) -> bool:
        return self.placement.dataset_class == "critical"


class Admission:
    """The admission decisions of one agent (see the module docstring)."""

    def __init__(
        self,
        region: str,
        view: PolicySource,
        fence: FencedResource,
        owners: OwnerSource,
        metrics: AgentMetrics,
        *,
        announce: Announcer | None = None,
        fresh_owner: FreshOwner | None = None,
    ) -> None:
        self.region = region
        self._view = view
        self._fence = fence
        self._owners = owners
        self._metrics = metrics
        self._announce = announce
        self._fresh_owner = fresh_owner
        self._announced: set[str] = set()
        # Placing a dataset the publish did not list runs the planner: kept per snapshot.
        self._placed_in: CompiledPolicy | None = None
        self._placed: dict[str, Placement | None] = {}
        # dataset -> the pushed copies of it between their owner read and their commit
        self._receiving: dict[str, set[asyncio.Future[None]]] = {}
        # This agent's own commits whose pushes began (bound by the daemon to its
        # SyncReplication): a complete listing waits for them too, so that another agent
        # of this region taking over never proves one of them lone (`settle_for_listing`).
        self.local_commits: Callable[[str], Awaitable[None]] | None = None

    # -- placement and residency ---------------------------------------------------------

    def placement(self, dataset: str) -> Placement:
        """The dataset's placement under the applied policy; `NotGovernedError` when none."""
        return self._decide(dataset)[1]

    def admit_store(self, dataset: str) -> Placement:
        """This region may hold a copy of `dataset`, else `ResidencyError` (counted)."""
        policy, placement = self._decide(dataset)
        self._residency(policy, placement, self.region, "receive")
        return placement

    def admit_send(self, dataset: str, to_region: str) -> Placement:
        """`to_region` may hold a copy of `dataset`, else `ResidencyError` (counted)."""
        policy, placement = self._decide(dataset)
        self._residency(policy, placement, to_region, "send")
        return placement

    def _decide(self, dataset: str) -> tuple[CompiledPolicy, Placement]:
        try:
            policy = self._view.require()
        except NoPolicyError as exc:
            log.warning("admission_no_policy", dataset=dataset, error=str(exc))
            raise NotGovernedError(f"dataset {dataset} cannot be admitted: {exc}") from exc
        try:
            placement = self._place(policy, dataset)
        except InvalidInputError as exc:
            # The published rules cannot be rebuilt: not the caller's fault, and no
            # decision can be taken on them.
            raise NotGovernedError(
                f"dataset {dataset}: the applied policy (revision {policy.revision}) cannot "
                f"place it ({exc}); refused until a readable policy is applied"
            ) from exc
        if placement is None:
            log.warning("admission_not_governed", dataset=dataset, revision=policy.revision)
            raise NotGovernedError(
                f"dataset {dataset} is governed by no policy of the applied revision "
                f"{policy.revision}; refused until `meridian policy apply` places it"
            )
        return policy, placement

    def _place(self, policy: CompiledPolicy, dataset: str) -> Placement | None:
        known = policy.placements.get(dataset)
        if known is not None:
            return known
        if self._placed_in is not policy or len(self._placed) >= _PLACED_MAX:
            self._placed_in, self._placed = policy, {}
        if dataset not in self._placed:
            self._placed[dataset] = policy.placement(dataset)
        return self._placed[dataset]

    async def _announce_new(self, policy: CompiledPolicy, dataset: str) -> None:
        """Announce a dataset the applied policy's publish did not list (placed by its
        rules) once, so that controllers claim and fail it over (see
        controlplane/coordination/protocols/datasets.py)."""
        if self._announce is None or dataset in policy.placements or dataset in self._announced:
            return
        try:
            await self._announce(dataset)
        except MeridianError as exc:
            # A standard write needs no etcd; the next write announces it again.
            log.warning("dataset_announce_failed", dataset=dataset, error=str(exc))
            return
        self._announced.add(dataset)

    def _residency(
        self, policy: CompiledPolicy, placement: Placement, region: str, direction: Direction
    ) -> None:
        try:
            jurisdiction = policy.jurisdiction(region)
        except NotFoundError as exc:
            raise NotGovernedError(
                f"dataset {placement.dataset}: region {region} is not in the applied topology "
                f"(revision {policy.revision}), so its residency cannot be decided; refused"
            ) from exc
        if jurisdiction in placement.residency:
            return
        self._metrics.residency_refused.labels(dataset=placement.dataset, direction=direction).inc()
        allowed = ", ".join(placement.residency)
        log.warning(
            "residency_refused",
            dataset=placement.dataset,
            region=region,
            jurisdiction=jurisdiction,
            residency=list(placement.residency),
            direction=direction,
            policy=placement.policy,
            revision=policy.revision,
        )
        where = "store" if direction == "receive" else "receive"
        raise ResidencyError(
            f"dataset {placement.dataset} may only be held in {allowed} (policy "
            f"{placement.policy}, revision {policy.revision}); region {region} is in "
            f"{jurisdiction} and may not {where} a copy"
        )

    # -- fencing -------------------------------------------------------------------------

    async def admit_write(self, dataset: str, epoch: int | None) -> Admitted:
        """A client write (Put, Delete, CommitSet) in this region.

        Residency first; then, for a critical dataset: this region owns it, no
        handover is marked, and `epoch` (None: the owner's current one is attached)
        is the current epoch read from etcd (`StaleEpochError` when older,
        `FencedError` when it names no epoch etcd holds), and the fence agrees."""
        policy, placement = self._decide(dataset)
        self._residency(policy, placement, self.region, "receive")
        await self._announce_new(policy, dataset)
        if placement.dataset_class != "critical":
            # Standard datasets are written in any region (LWW); an epoch means nothing.
            return Admitted(placement, 0, policy.revision)
        owner = await self._owners.owner(dataset)
        # The client, or this agent's fence (told by the ownership watch), knows a
        # newer epoch than the bounded-age read: a claim committed within that read's
        # age, by this region too. etcd decides, read now; else a write at the current
        # epoch is refused as unknown, or as this region's own stale one, and a
        # renewed owner would step down from its own dataset.
        newest = max(epoch or 0, self._fence.highest_epoch(dataset))
        if self._fresh_owner is not None and (owner is None or newest > owner.epoch):
            owner = await self._fresh_owner(dataset)
        if owner is None:
            raise NotGovernedError(
                f"critical dataset {dataset} has no owner in etcd yet (its home region's "
                "controller claims it); the write is refused until it has one"
            )
        if owner.region != self.region:
            log.warning(
                "write_refused_not_owner",
                dataset=dataset,
                owner=owner.region,
                epoch=owner.epoch,
                region=self.region,
            )
            raise NotOwnerError(
                f"critical dataset {dataset} is owned by {owner.region} at epoch {owner.epoch}, "
                f"not by this agent's region {self.region}; write through an agent of "
                f"{owner.region}"
            )
        # What etcd said is at least as new as what the watch told the fence; the fence
        # then refuses a marked handover, or an epoch it has seen superseded.
        self._fence.observe(
            dataset, owner.epoch, handing_over=owner.handing_over, revision=owner.revision
        )
        if epoch is not None and epoch != owner.epoch:
            if epoch < owner.epoch:
                self._refused_stale(dataset, epoch, owner.epoch)
            raise FencedError(
                f"write to {dataset} carried epoch {epoch}, but the current epoch in etcd is "
                f"{owner.epoch}; re-read the owner and write at its epoch"
            )
        self._fenced(dataset, owner.epoch)
        return Admitted(placement, owner.epoch, policy.revision)

    def admit_replica(
        self,
        dataset: str,
        epoch: int,
        origin_region: str,
        *,
        rewind: bool = False,
        fresh_read_next: bool = False,
    ) -> Placement:
        """A copy pushed to this region (Replicate, a fetched version): residency, and for
        a critical dataset the fence (an epoch older than the newest seen, or a marked
        handover, is refused). `origin_region` must be the owner at that epoch when the
        owner record of that epoch is known here.

        A handover's target takes the owner's copies at the owner's epoch through the
        freeze (`_through_handover`); a `rewind` (a drop, not a copy) never does.
        `fresh_read_next`: the caller reads etcd's owner record at once
        (`admit_replica_current`), which decides the handover: a mark known here only
        from the watch may already be gone (a switchover just ended or aborted, its
        event not yet delivered), and refusing on it refused copies etcd allows."""
        placement = self.admit_store(dataset)
        if placement.dataset_class != "critical":
            return placement
        if epoch <= 0:
            raise InvalidInputError(
                f"a copy of critical dataset {dataset} from {origin_region} must carry the "
                "owner's epoch (got none)"
            )
        known = self._owners.known(dataset)
        if known is not None and known.epoch == epoch and known.region != origin_region:
            # Epochs are etcd revisions of ownership writes: one epoch, one owner.
            raise FencedError(
                f"a copy of {dataset} at epoch {epoch} came from {origin_region}, but the "
                f"owner at that epoch is {known.region}; refused"
            )
        through = fresh_read_next or (
            not rewind and self._through_handover(known, epoch, origin_region)
        )
        self._fenced(dataset, epoch, through_handover=through)
        return placement

    async def admit_replica_current(
        self, dataset: str, epoch: int, origin_region: str, *, rewind: bool = False
    ) -> Placement:
        """`admit_replica`, then, for a critical dataset, the owner record read from etcd
        now (`fresh_owner`; the bounded-age `owners` without one): the copy is refused
        unless `origin_region` owns the dataset at exactly `epoch` with no handover
        marked (or one to this region, `_through_handover`). Called just before a
        replica commits a pushed copy, so a former owner
        whose own reads lag (paused, partitioned, its read reused) cannot get a copy
        acked once etcd names another owner: the watch feeding the fence may lag, etcd
        does not."""
        placement = self.admit_replica(
            dataset, epoch, origin_region, rewind=rewind, fresh_read_next=True
        )
        if placement.dataset_class != "critical":
            return placement
        read = self._fresh_owner or self._owners.owner
        owner = await read(dataset)
        if owner is None:
            raise NotGovernedError(
                f"a copy of critical dataset {dataset} at epoch {epoch} came from "
                f"{origin_region}, but etcd holds no owner for it; refused"
            )
        self._fence.observe(
            dataset, owner.epoch, handing_over=owner.handing_over, revision=owner.revision
        )
        if owner.epoch > epoch:
            self._refused_stale(dataset, epoch, owner.epoch)
        if owner.epoch != epoch or owner.region != origin_region:
            raise FencedError(
                f"a copy of {dataset} at epoch {epoch} came from {origin_region}, but etcd "
                f"names {owner.region} at epoch {owner.epoch} as its owner; refused"
            )
        # A handover marked in etcd refuses it (UNAVAILABLE), unless this is its target.
        through = not rewind and self._through_handover(owner, epoch, origin_region)
        self._fenced(dataset, epoch, through_handover=through)
        return placement

    def _through_handover(self, owner: OwnerRecord | None, epoch: int, origin: str) -> bool:
        """Whether a copy passes a marked handover: pushed by the owner at its current
        epoch to the region the dataset hands over to. The switchover moves only once
        its target holds every acked version, so a target that was behind as the
        freeze began (a catch-up still running, a push in flight as the mark landed)
        must still take them; refusing them aborted the switchover (CI found it). It is
        safe: every other replica refuses what it checks during the freeze, so a
        version acked then (the owner's own admission may decide on a read up to its
        bound old) is held by the target, which the move goes to, and a later epoch
        fences all of it. The target's store observes the copy's HLC before its
        fsync (ObjectStore.commit_apply), so a copy admitted just before the move
        cannot supersede a write made there after it."""
        return (
            owner is not None
            and owner.handing_over
            and owner.handover_to == self.region
            and owner.region == origin
            and owner.epoch == epoch
        )

    async def owner_now(self, dataset: str) -> OwnerRecord | None:
        """The owner record read from etcd now (`fresh_owner`; the bounded-age `owners`
        without one), told to the fence: an owner whose push a replica refused as stale
        asks this to tell a re-claim by its own region (a newer epoch the watch has not
        delivered yet) from a real loss of ownership, and its next write is admitted at
        the epoch read."""
        read = self._fresh_owner or self._owners.owner
        owner = await read(dataset)
        if owner is not None:
            self._fence.observe(
                dataset, owner.epoch, handing_over=owner.handing_over, revision=owner.revision
            )
        return owner

    @contextlib.contextmanager
    def receiving(self, datasets: Iterable[str]) -> Iterator[None]:
        """Around a pushed copy's owner read (`admit_replica_current`) and its commit:
        a complete listing of these datasets waits for it (`settle_for_listing`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        names = set(datasets)
        for dataset in names:
            self._receiving.setdefault(dataset, set()).add(done)
        try:
            yield
        finally:
            done.set_result(None)
            for dataset in names:
                running = self._receiving.get(dataset)
                if running is not None:
                    running.discard(done)
                    if not running:
                        del self._receiving[dataset]

    async def settle_for_listing(self, dataset: str) -> None:
        """Before a complete listing of a critical dataset (a new owner's takeover pass,
        module docstring): etcd's owner record read now and told to the fence, then the
        copies already past their own read waited for (each commits or fails), then this
        agent's own writes already being pushed (`local_commits`)."""
        try:
            critical = self._decide(dataset)[1].dataset_class == "critical"
        except MeridianError:
            return  # not placed here: nothing of it is pushed to this agent
        if not critical:
            return
        await self.owner_now(dataset)
        await self.received(dataset)
        if self.local_commits is not None:
            await self.local_commits(dataset)

    async def received(self, dataset: str) -> None:
        """Until the copies of `dataset` then past their owner read have committed or
        failed (an owner's own takeover pass and catch-up read this store after them)."""
        running = self._receiving.get(dataset)
        if running:
            await asyncio.wait(list(running))

    def _fenced(self, dataset: str, epoch: int, *, through_handover: bool = False) -> None:
        try:
            self._fence.admit(dataset, epoch, through_handover=through_handover)
        except StaleEpochError:
            self._metrics.stale_epoch_refused.labels(dataset=dataset).inc()
            log.warning(
                "stale_epoch_refused",
                region=self.region,
                dataset=dataset,
                epoch=epoch,
                newest=self._fence.highest_epoch(dataset),
            )
            raise
        except DatasetHandingOverError:
            self._metrics.handover_refused.labels(dataset=dataset).inc()
            log.info("handover_refused", dataset=dataset, epoch=epoch)
            raise

    def _refused_stale(self, dataset: str, epoch: int, current: int) -> NoReturn:
        self._metrics.stale_epoch_refused.labels(dataset=dataset).inc()
        log.warning(
            "stale_epoch_refused", region=self.region, dataset=dataset, epoch=epoch, newest=current
        )
        raise StaleEpochError(
            f"write to {dataset} carried epoch {epoch}, older than its current epoch {current} "
            "in etcd; this writer lost ownership and must step down"
        )
