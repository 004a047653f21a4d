"""One node agent: the parts of `meridian agent serve`, started in order, stopped in reverse.

Start (each step raises one clear error, and what was started is stopped again):

1. the applied policy (`PolicyView`): etcd must answer, and the region must be in
   the applied topology (an agent of an unknown region could not admit anything);
2. the owners of critical datasets: the watched map (`OwnershipWatch`), feeding the
   fence, and the bounded-age reads admission decides on (`agents.owners.EtcdOwners`);
3. the store (startup repair, logged by the store);
4. the gRPC API on `--listen`: the servicer, admission in front of it, and the
   transfers (Signature, Sync, Replicate, Fetch) behind it; in a region with a cache
   bound (`MERIDIAN_REGION_CACHE`), the read-through cache (agents/cache/) with its
   change-log reader and prefetcher, before it;
5. the records duties (records.py): the recorder shipping the store's journal to
   the catalog, the outbox drain publishing change events to Kafka (neither needs
   its engine up to start);
6. the metrics endpoint, if asked;
7. the registration on a lease (last, so that a listed agent answers), then the
   rebalance and the fast-fail watch on two region peers (agents/placement/fastfail.py).

Stop (SIGTERM): the registration goes first (its lease revoked, so peers stop
choosing this agent at once), then the server stops accepting calls and gives
those in flight `stop_grace_s` to finish; the rest are cancelled, and a cancelled
write leaves nothing behind (the store commits a version only whole). Then the
records duties, the watches and the store stop.
"""

from __future__ import annotations

import asyncio
import socket

import grpc.aio

from agents.admission import Admission
from agents.cache import Invalidator, Prefetcher, ReadCache, ResidencySweeper
from agents.daemon.config import AgentConfig, parse_listen
from agents.daemon.expiry import TombstoneExpiry
from agents.daemon.holdings import HoldingsPublisher, UnackedWrites
from agents.daemon.identity import Identity
from agents.daemon.metrics_http import MetricsEndpoint, bind_store_gauges
from agents.daemon.owners import OwnershipWatch
from agents.daemon.records import RecordDuties
from agents.daemon.registration import AgentRecord, Registration
from agents.metrics import AgentMetrics
from agents.owners import EtcdOwners
from agents.placement import MembershipWatch
from agents.placement.fastfail import FastFailDetector
from agents.placement.members import Members, copies_for
from agents.placement.roster import Roster
from agents.rebalance import Rebalancer
from agents.replication import EtcdPeers, SyncReplication
from agents.replication.replica_pushes import ReplicaPushes
from agents.replication.replica_sets import ReplicaSets
from agents.replication.sync import Adopt
from agents.routing import PeerStubs, RoutedAgentService
from agents.service.server import start_server, stop_server
from agents.store import ObjectStore
from agents.transfer.service import TransferService
from agents.transfer.sweep import ResumeSweeper
from controlplane.coordination.protocols.datasets import announce
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.protocols.ownership import Owner
from controlplane.domain.hlc import HybridClock, offset_ms
from controlplane.domain.version import Version
from controlplane.errors import MeridianError, NotFoundError
from controlplane.lifecycle import Lifecycle
from controlplane.logs import get_logger
from controlplane.policy.current import PolicyView
from controlplane.ports.coordination import Coordination
from controlplane.settings import Settings
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2

log = get_logger("meridian.agent")

# How long the synchronous push reuses a replica agent's address (agents/replication/peers.py).
PEER_MAX_AGE_S = 1.0


class NodeAgent(Lifecycle):
    """See the module docstring. `endpoint` and `metrics_address` are known once started."""

    def __init__(
        self, config: AgentConfig, settings: Settings, coord: Coordination, identity: Identity
    ) -> None:
        self.config = config
        self.settings = settings
        self.coord = coord
        self.identity = identity
        self.region = config.region
        self.metrics = AgentMetrics(config.region, identity.agent_id)
        self.fence = FencedResource()
        self.view = PolicyView(
            coord, retry_initial_s=config.retry_initial_s, retry_max_s=config.retry_max_s
        )
        self.watch = OwnershipWatch(
            coord,
            self.fence,
            retry_initial_s=config.retry_initial_s,
            retry_max_s=config.retry_max_s,
        )
        self.owners = EtcdOwners(coord, self.fence, watched=self.watch)
        # The region's agents (issue 16): placement, routing and rebalance follow it.
        self.members = MembershipWatch(
            coord,
            config.region,
            configured_r=settings.copies_of(config.region),
            retry_initial_s=config.retry_initial_s,
            retry_max_s=config.retry_max_s,
        )
        self.peers = PeerStubs(identity.agent_id)
        self.store: ObjectStore | None = None
        self.server: grpc.aio.Server | None = None
        self.endpoint = ""
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.registration: Registration | None = None
        self.records: RecordDuties | None = None
        self.replication: SyncReplication | None = None
        self.holdings: HoldingsPublisher | None = None
        self.rebalancer: Rebalancer | None = None
        self.fast_fail: FastFailDetector | None = None
        self.sweeper: ResumeSweeper | None = None
        self.expiry: TombstoneExpiry | None = None
        self.cache: ReadCache | None = None
        self.prefetcher: Prefetcher | None = None
        self.invalidator: Invalidator | None = None
        self.residency_sweeper: ResidencySweeper | None = None
        self.admission: Admission | None = None
        self._taken: dict[str, int] = {}  # dataset -> the epoch a takeover was begun at
        self._takeovers: set[asyncio.Task[None]] = set()
        self.roster: Roster | None = None
        self._roster_tasks: set[asyncio.Task[None]] = set()

    @property
    def metrics_address(self) -> str | None:
        return self.metrics_endpoint.address if self.metrics_endpoint else None

    async def _do_start(self) -> None:
        await self.view.start()
        self._check_region()
        self.metrics.expect_peers(r for r in self.view.require().regions if r != self.region)
        await self.watch.start()
        await self.members.start()
        clock = HybridClock(
            self.region,
            max_clock_skew_ms=self.settings.max_clock_skew_ms,
            physical_ms=offset_ms(self.settings.clock_offset_ms),
        )
        self.store = store = await asyncio.to_thread(
            ObjectStore,
            self.config.root,
            clock=clock,
            keep_versions=self.config.keep_versions,
            tombstone_retention_s=self.settings.tombstone_retention_s,
            group_commit=self.settings.store_group_commit,
        )
        admission = Admission(
            self.region,
            self.view,
            self.fence,
            self.owners,
            self.metrics,
            announce=self._announce,
            fresh_owner=self.owners.owner_now,
        )
        # The policy as of each transfer (RTTs for source order, per-link caps).
        transfers = TransferService(
            store,
            admission,
            self.region,
            self.metrics,
            None,
            lambda: self.view.current,
            bundle_max_bytes=self.settings.bundle_max_bytes,
        )
        # Cut transfers never retried: their resume states expire (at start, then here).
        self.sweeper = ResumeSweeper(transfers.book, interval_s=self.config.resume_sweep_interval_s)
        await self.sweeper.start()
        # Deletes past the retention are forgotten (the spec's tombstone_retention).
        self.expiry = TombstoneExpiry(
            store,
            self.metrics,
            self._placed,
            self._forgettable,
            interval_s=self.settings.tombstone_expiry_interval_s,
        )
        await self.expiry.start()
        # Critical writes: pushed to the replica regions' agents, acked at `ack` copies.
        self.replication = SyncReplication(
            store,
            self.region,
            # Reused for a second (not read from etcd at every push): see peers.py.
            EtcdPeers(self.coord, self.settings.agent_address, max_age_s=PEER_MAX_AGE_S),
            adopt=_adopter(transfers),
            owner_now=admission.owner_now,  # a stale refusal: re-claimed, or deposed?
            copies_received=admission.received,
            metrics=self.metrics,
            alone_in_region=self._alone_in_region,
            placement_now=admission.placement,
        )
        admission.local_commits = self.replication.local_commits_ended
        # A region holding no replica of a dataset its residency allows may read it
        # through a bounded cache (issue 16), when the region has a cache bound.
        cache = await self._start_cache(store, clock, admission)
        # A region of one agent is served as by AgentService; of several, routed.
        service = RoutedAgentService(
            store,
            admission,
            self.region,
            self.identity.agent_id,
            self.metrics,
            transfers,
            # Writes whose ack failed are remembered for the failover (holdings.py).
            replication=(unacked := UnackedWrites(self.replication)),
            sets=(replica_sets := ReplicaSets(store, admission, self.region)),  # critical sets
            members=self.members,
            peers=self.peers,
            cache=cache,
            max_object_bytes=self.config.max_object_bytes,
        )
        # Critical pushes batched by their owner (replica_pushes.py): alone in the region.
        service.pushes = ReplicaPushes(
            store,
            admission,
            self.region,
            self.metrics,
            lambda: self.view.current,
            alone=self._alone_in_region,
        )
        self.server, port = await start_server(service, self.config.listen)
        self.endpoint = service.endpoint = self._advertised(port)
        # Owning a critical dataset at a new epoch (now, or when the watch says so): the
        # takeover pass brings every copy region level (agents/replication/sync.py).
        self.admission = admission
        self.watch.on_owner = self._owner_seen
        for owner in self.watch.owners():
            self._owner_seen(owner)
        bind_store_gauges(self.metrics, store.usage)
        self.records = RecordDuties(
            store,
            self.metrics,
            self.region,
            self.settings,
            origin_agent=self.endpoint,
            policy=lambda: self.view.current,
        )
        await self.records.start()
        if self.config.metrics is not None:
            self.metrics_endpoint = MetricsEndpoint(self.metrics, self.config.metrics)
        self.rebalancer = Rebalancer(
            store,
            self.members,
            self.peers,
            self.identity.agent_id,
            self.region,
            lambda: self.endpoint,
            publish=self._publish_registration,
            interval_s=self.settings.rebalance_interval_s,
            registry=self.metrics.registry,
        )
        self.registration = Registration(
            self.coord,
            AgentRecord(
                agent_id=self.identity.agent_id,
                region=self.region,
                endpoint=self.endpoint,
                weight=self.config.weight,
                started_at=Registration.started_now(),
            ),
            store.usage,
            lease_ttl_s=self.config.lease_ttl_s,
            usage_interval_s=self.config.usage_interval_s,
            retry_initial_s=self.config.retry_initial_s,
            retry_max_s=self.config.retry_max_s,
            extra=self._registration_fields,
        )
        # The durable roster entry goes first (no lease): an agent killed from now on
        # leaves it, and a complete listing is refused until it is back or the loss is
        # covered (agents/placement/departures.py). A returning agent rewrites its own.
        # Only with `departure_records` on (settings.py says why it is off by default).
        if self.settings.departure_records:
            self.roster = Roster(
                self.coord, self.region, self.identity.agent_id, registry=self.metrics.registry
            )
            current = self.members.current
            others = [m for m in current.serving if m.agent_id != self.identity.agent_id]
            copies = copies_for(len(others) + 1, current.configured_r)
            if await asyncio.to_thread(store.holds_sets):
                copies = 1  # a set's members are on this agent alone
            await self.roster.write(copies, self.endpoint)
            self.registration.on_registered = self.roster.restore
            service.roster = self.roster
            service.holding_sets = replica_sets.holding_sets = self._holding_sets
            transfers.holding_sets = self.replication.holding_sets = self._holding_sets
            self.members.on_change(self._copies_seen)
            self.rebalancer.on_settled = self._rebalance_settled
        await self.registration.start()
        # What it holds of critical datasets, for the failover's choice (issue 13).
        self.holdings = HoldingsPublisher(
            self.coord,
            store,
            region=self.region,
            agent_id=self.identity.agent_id,
            endpoint=self.endpoint,
            policy=lambda: self.view.current,
            fence=self.fence,
            lease_ttl_s=self.config.lease_ttl_s,
            unacked=unacked,
            retry_initial_s=self.config.retry_initial_s,
            retry_max_s=self.config.retry_max_s,
        )
        await self.holdings.start()
        await self.rebalancer.start()
        if self.settings.fast_fail_on_refused:
            # Peers whose port refuses connections are marked down at once (fastfail.py).
            self.fast_fail = FastFailDetector(
                self.coord,
                self.members,
                self.identity.agent_id,
                retry_initial_s=self.config.retry_initial_s,
                retry_max_s=self.config.retry_max_s,
                registry=self.metrics.registry,
            )
            await self.fast_fail.start()
        log.info(
            "agent_ready",
            region=self.region,
            id=self.identity.agent_id,
            endpoint=self.endpoint,
            metrics=self.metrics_address,
            root=str(self.config.root),
        )

    async def _start_cache(
        self, store: ObjectStore, clock: HybridClock, admission: Admission
    ) -> ReadCache | None:
        limit = self.settings.cache_limit_of(self.region)
        if limit is None:
            return None
        self.cache = cache = ReadCache(
            self.config.root / "cache",
            journal=store,
            clock=clock,
            admission=admission,
            metrics=self.metrics,
            policy=lambda: self.view.current,
            peers=EtcdPeers(self.coord, self.settings.agent_address),
            limit_bytes=limit,
            fresh_s=self.settings.cache_fresh_s,
        )
        await cache.start()
        self.prefetcher = Prefetcher(cache, self.settings.cache_prefetch)
        self.invalidator = Invalidator(
            cache,
            self.settings.kafka_bootstrap,
            f"meridian-cache-{self.region}-{self.identity.agent_id}",
            retry_initial_s=self.config.retry_initial_s,
            retry_max_s=max(self.config.retry_max_s, 5.0),
        )
        await self.invalidator.start()
        self.residency_sweeper = ResidencySweeper(cache, self.view)
        await self.residency_sweeper.start()
        log.info("cache_ready", region=self.region, limit_bytes=limit)
        return cache

    def _registration_fields(self) -> dict[str, object]:
        fields = self.rebalancer.registration_fields() if self.rebalancer is not None else {}
        if self.cache is not None:
            fields["cache"] = self.cache.report()
        recorder = self.records.recorder if self.records is not None else None
        if recorder is not None:
            # How far behind this agent's records in the catalog are (dataplane.md,
            # Records: `audit` and `replication status` say it per region). Whole
            # seconds, so a registration is rewritten only when it moves by one.
            fields["records_behind_s"] = round(recorder.behind_seconds())
        return fields

    def _copies_seen(self, current: Members) -> None:
        """A smaller `r` lowers this agent's roster entry at once (what it places from
        now on may have only that many copies)."""
        roster = self.roster
        if roster is None or current.get(self.identity.agent_id) is None:
            return
        task = asyncio.create_task(self._lower_copies(roster, current.r), name="roster-copies")
        self._roster_tasks.add(task)
        task.add_done_callback(self._roster_tasks.discard)

    async def _lower_copies(self, roster: Roster, r: int) -> None:
        try:
            await roster.see_copies(r)
        except MeridianError as exc:
            log.warning("roster_copies_not_lowered", error=str(exc), copies=r)

    async def _holding_sets(self) -> None:
        """Before a set (or a member) is stored here: this agent's entry vouches for 1
        copy from now on, since a SIGKILL before the next settled pass would otherwise
        leave an entry a survivor may clear (fewer departed than its count)."""
        if self.roster is not None:
            await self.roster.holding_sets()

    async def _rebalance_settled(self, current: Members) -> None:
        """Settled under `current`: everything this agent holds is at its `r` owners, so
        its entry vouches for `r` (raised too), and the departed entries may go when
        departures.may_clear allows it. An agent that holds a version set vouches for 1:
        a set's members are on the agent that took it alone (the rebalance leaves them)."""
        if self.roster is None or self.store is None:
            return
        sets = await asyncio.to_thread(self.store.holds_sets)
        await self.roster.settled_at(1 if sets else current.r, lambda: self.members.current.r)
        await self.roster.clear_settled(current)

    async def _publish_registration(self) -> None:
        if self.registration is not None:
            await self.registration.publish()

    async def _announce(self, dataset: str) -> None:
        await announce(self.coord, dataset, by=self.identity.agent_id)

    def _alone_in_region(self) -> bool:
        return all(a == self.identity.agent_id for a in self.members.current.all)

    def _placed(self, dataset: str) -> bool:
        """Whether the applied policy places `dataset` (tombstone expiry: one it does not
        place keeps its tombstones, its class unknown)."""
        policy = self.view.current
        return policy is not None and policy.placement(dataset) is not None

    async def _forgettable(self, dataset: str, deletes: list[tuple[str, str]]) -> set[str]:
        """Which of a dataset's expired deletes may be forgotten (expiry.py): all of a
        standard dataset's; of a critical one's, those of which every agent of every copy
        region is proven to show that very delete or nothing of the object."""
        policy = self.view.current
        placement = policy.placement(dataset) if policy is not None else None
        if placement is None:
            return set()
        if placement.dataset_class != "critical":
            return {key for key, _ in deletes}
        if self.replication is None:
            return set()
        return await self.replication.forgettable_deletes(dataset, placement, deletes)

    def _check_region(self) -> None:
        policy = self.view.current
        if policy is None or self.region not in policy.regions:
            known = ", ".join(sorted(policy.regions)) if policy else ""
            raise NotFoundError(
                f"region {self.region!r} is not in the applied topology "
                f"(it has: {known or 'none (apply a policy first)'})"
            )

    def _advertised(self, port: int) -> str:
        if self.config.advertise is not None:
            return self.config.advertise
        host, _ = parse_listen(self.config.listen, "--listen")
        if host in ("0.0.0.0", "::", "[::]", ""):  # noqa: S104 - naming the wildcard, not binding
            host = socket.gethostname()
        return f"{host}:{port}"

    def _owner_seen(self, owner: Owner) -> None:
        if owner.region != self.region or owner.epoch <= self._taken.get(owner.dataset, 0):
            return
        self._taken[owner.dataset] = owner.epoch
        task = asyncio.create_task(self._take_over(owner), name=f"takeover {owner.dataset}")
        self._takeovers.add(task)
        task.add_done_callback(self._takeovers.discard)

    async def _take_over(self, owner: Owner) -> None:
        if self.admission is None or self.replication is None or self.store is None:
            return
        delay = self.config.retry_initial_s
        # While the watch still names this region at this epoch: the pass is begun only
        # here (the epoch is marked taken), and a quiet dataset may never be written to
        # start it otherwise (chaos scenario 10).
        for _attempt in range(1_000_000):
            current = self.watch.owner(owner.dataset)
            if current is None or (current.region, current.epoch) != (owner.region, owner.epoch):
                return  # moved on: the watch tells us of the next owner
            try:
                # As a write would be admitted: this region owns it, at this epoch, per etcd.
                admitted = await self.admission.admit_write(owner.dataset, owner.epoch)
            except MeridianError as exc:
                log.info("takeover_not_started", dataset=owner.dataset, error=str(exc))
                if not exc.retriable:
                    return
                await asyncio.sleep(delay)  # etcd away, a handover mark still seen: again
                delay = min(self.config.retry_max_s, delay * 2)
                continue
            self.replication.took_over(admitted, owner.dataset, self.store.clock.now())
            return

    async def _do_stop(self) -> None:
        self.watch.on_owner = None  # no takeover begins once stopping
        for task in list(self._takeovers):
            task.cancel()
        if self.fast_fail is not None:
            await self.fast_fail.stop()
        if self.sweeper is not None:
            await self.sweeper.stop()
        if self.expiry is not None:
            await self.expiry.stop()
        if self.rebalancer is not None:
            if self.rebalancer.running and self.registration is not None:
                # Hand what this agent holds to the region's other agents while it
                # still serves their pulls (a lone agent has nobody to hand to).
                drained = await self.rebalancer.drain(self.settings.drain_timeout_s)
                if drained and self.roster is not None:
                    # Everything was handed over: this agent leaves no departure behind.
                    # An undrained (or lone) agent keeps its entry: it may hold the
                    # only copies of acked writes.
                    try:
                        await self.roster.remove()
                    except MeridianError as exc:
                        log.warning("roster_not_removed", error=str(exc))
            await self.rebalancer.stop()
        if self.holdings is not None:
            await self.holdings.stop()
        if self.registration is not None:
            await self.registration.stop()
        if self.server is not None:
            log.info("agent_stopping", region=self.region, grace_s=self.config.stop_grace_s)
            await stop_server(self.server, self.config.stop_grace_s)
        if self.replication is not None:
            await self.replication.close()
        if self.invalidator is not None:
            await self.invalidator.stop()
        if self.residency_sweeper is not None:
            await self.residency_sweeper.stop()
        if self.prefetcher is not None:
            await self.prefetcher.stop()
        if self.cache is not None:
            await self.cache.stop()
        await self.peers.close()
        if self.records is not None:
            await self.records.stop()
        if self.metrics_endpoint is not None:
            await asyncio.to_thread(self.metrics_endpoint.close)
        await self.members.stop()
        await self.watch.stop()
        await self.view.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        log.info("agent_shutdown_complete", region=self.region, id=self.identity.agent_id)


def _adopter(transfers: TransferService) -> Adopt:
    """The takeover pass's pull of a version another copy region holds and this owner
    lacks (agents/replication/sync.py): a Fetch from that region's agent, by LWW, or,
    named a set recorded here that needs it, as that set's member even under a newer
    put of its key (ObjectStore.wanted)."""

    async def adopt(
        dataset: str, key: str, version: Version, region: str, address: str, set_id: str | None
    ) -> bool:
        request = agent_pb2.FetchRequest(
            dataset=dataset,
            key=key,
            version=version_to_wire(version),
            sources=[agent_pb2.FetchSource(region=region, address=address)],
            origin_region=region,
        )
        if set_id is not None:
            request.set = set_id  # stored as a member of that set, as its pushes were
        response = await transfers.fetch(request)
        return response.outcome in (
            agent_pb2.APPLY_OUTCOME_APPLIED,
            agent_pb2.APPLY_OUTCOME_SAME,
        )

    return adopt
