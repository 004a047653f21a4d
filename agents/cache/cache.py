"""`ReadCache`: reads of a dataset this region holds no replica of, served through a
bounded, LRU-evicted cache filled from the nearest holder (issue 16).

Which reads: a Get or Stat that the agent's own store cannot answer, of a dataset
whose applied placement names neither this region as home nor as a replica
(`serves`). Everything else is served as without a cache.

- **Residency first.** Each read is admitted like a copy into this region
  (`Admission.admit_store`): a dataset whose residency excludes the region is
  refused with `CacheResidencyError` (PERMISSION_DENIED, counted in
  `meridian_residency_refused_total` and journalled as a refused transfer, as every
  refused copy is), before anything is asked of a holder; a hit is admitted again,
  and at each new policy revision `ResidencySweeper` drops every entry of a dataset
  the region may no longer hold (residency.py).
- **Fill.** The holders are the placement's regions (home, replicas) nearest first by
  the policy's RTT; the version is asked of the first that answers (Stat) and pulled
  with the transfer machinery (`agents.transfer.pull`: Sync, resumable, a delta when
  an older cached version is the basis) into the cache's own store
  (`ROOT/cache/`, one version per object), never into the agent's store: a cached
  copy is no replica, so it is in no listing, holdings record, catalog replica or
  rebalance. Each fill's transfer record goes to the agent's journal (method
  `cache-<method>`), so `audit transfers` and `audit residency` see every cached copy.
- **Bound.** `LruIndex` keeps the cached bytes within the region's bound; an object
  larger than the whole bound is served and not kept.
- **Never stale past the change log.** An entry is dropped when the change log
  (agents/cache/changelog.py) reports a newer version of its object (put or delete).
  Entries are trusted without asking anyone only while the change log was read less
  than `fresh_s` ago and only for standard datasets (critical writes publish no change
  events): otherwise a hit first asks a holder for the newest version (one Stat, no
  bytes) and refills when it changed. A fill that the change log already knows is
  older is fetched again once, and if the holder still has nothing newer, served and
  not kept. The cache starts empty (what it held missed the change log while down).
- **Prefetch.** `Prefetcher` (prefetch.py) follows readers walking a dataset in key
  order and fills the next objects ahead of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from agents.admission import Admission
from agents.cache.lru import Entry, LruIndex, Name
from agents.cache.metrics import CacheMetrics
from agents.errors import NotGovernedError, ResidencyError
from agents.metrics import AgentMetrics
from agents.replication.peers import EtcdPeers
from agents.rpc.status import from_rpc_error
from agents.store import MissingContentError, ObjectReader, ObjectStore
from agents.to_the_end import open_in_thread
from agents.transfer.pull import CHANNEL_OPTIONS, Source, pull
from agents.transfer.records import TransferTally, new_transfer_id
from agents.transfer.resume import ResumeBook
from agents.transfer.sources import order_sources
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.placement import Placement
from controlplane.domain.version import Version
from controlplane.errors import MeridianError, NotFoundError, UnavailableError
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc

log = get_logger("meridian.agent.cache")

PolicyNow = Callable[[], CompiledPolicy | None]
# Newest versions the change log announced, kept for this many objects (a fill that
# raced a newer write is recognised by it).
_SEEN_MAX = 65_536
_STAT_TIMEOUT_S = 10.0


class CacheResidencyError(ResidencyError):
    """A read through the cache of a dataset whose residency excludes this region: no
    copy, not even a cached one, may be held here (PERMISSION_DENIED, not retried)."""


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0


class ReadCache:
    """See the module docstring. `start()` empties and opens the cache's store."""

    def __init__(
        self,
        root: Path,
        *,
        journal: ObjectStore,
        clock: HybridClock,
        admission: Admission,
        metrics: AgentMetrics,
        policy: PolicyNow,
        peers: EtcdPeers,
        limit_bytes: int,
        fresh_s: float = 10.0,
    ) -> None:
        self.root = root
        self.journal = journal
        self.clock = clock
        self.region = clock.region
        self.admission = admission
        self.metrics = metrics
        self.policy = policy
        self.peers = peers
        self.fresh_s = fresh_s
        self.index = LruIndex(limit_bytes)
        self.counters = Counters()
        self.cache_metrics = CacheMetrics(metrics.registry, self)
        self.store: ObjectStore | None = None
        self.book: ResumeBook | None = None
        self._seen: OrderedDict[Name, HLC] = OrderedDict()
        self._filling: dict[Name, asyncio.Event] = {}  # set when that fill ends
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._log_read_at: float | None = None  # monotonic time of the last change-log read
        self.on_read: Callable[[Placement, str, str], None] | None = None  # the prefetcher

    @property
    def limit_bytes(self) -> int:
        return self.index.limit_bytes

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        def open_empty() -> ObjectStore:
            # What an earlier run cached missed the change log while it was down.
            shutil.rmtree(self.root, ignore_errors=True)
            return ObjectStore(self.root, clock=self.clock, keep_versions=1)

        self.store = await asyncio.to_thread(open_empty)
        self.book = ResumeBook(self.store.root)

    async def stop(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    def report(self) -> dict[str, object]:
        """The registration's `cache` field (summed by `meridian region show`)."""
        return {
            "bytes": self.index.bytes,
            "limit_bytes": self.index.limit_bytes,
            "objects": len(self.index),
            "hits": self.counters.hits,
            "misses": self.counters.misses,
        }

    # -- which reads ---------------------------------------------------------------------

    def serves(self, dataset: str) -> bool:
        """Whether a read of `dataset` this agent's store cannot answer goes through the
        cache: the dataset is governed and this region is neither home nor replica."""
        try:
            placement = self.admission.placement(dataset)
        except NotGovernedError:
            return False
        return self.region != placement.home and self.region not in placement.replicas

    # -- the change log ------------------------------------------------------------------

    def log_read(self) -> None:
        """The change log was read up to its end just now (changelog.py)."""
        self._log_read_at = time.monotonic()

    def log_lost(self) -> None:
        self._log_read_at = None

    async def notice(self, dataset: str, key: str, hlc: HLC) -> None:
        """The change log says `hlc` of dataset/key was written: an older entry goes."""
        name = (dataset, key)
        seen = self._seen.get(name)
        if seen is None or seen < hlc:
            self._seen[name] = hlc
        self._seen.move_to_end(name)
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        entry = self.index.peek(name)
        if entry is not None and entry.version.hlc < hlc:
            await self._drop(entry, "invalidated")

    def _trusted(self, placement: Placement) -> bool:
        at = self._log_read_at
        return (
            placement.dataset_class == "standard"
            and at is not None
            and time.monotonic() - at < self.fresh_s
        )

    def _trusted_entry(self, placement: Placement, entry: Entry) -> bool:
        """Whether `entry` may be served as the newest without asking its holders: the
        change log is trusted (`_trusted`) and the entry was filled as the newest."""
        return entry.newest and self._trusted(placement)

    # -- reads ---------------------------------------------------------------------------

    async def open(self, dataset: str, key: str, hlc: HLC | None) -> ObjectReader:
        """A reader of the newest version (or `hlc`), from the cache or filled now."""
        placement = self._admit(dataset, key)
        reader = await self._hit(placement, dataset, key, hlc)
        if reader is None:
            self.counters.misses += 1
            self.cache_metrics.read(hit=False)
            reader = await self._miss(placement, dataset, key, hlc)
        else:
            self.counters.hits += 1
            self.cache_metrics.read(hit=True)
        if self.on_read is not None:
            self.on_read(placement, dataset, key)
        return reader

    async def stat(self, dataset: str, key: str, hlc: HLC | None) -> agent_pb2.ObjectInfo:
        """The object's metadata: the entry's when it is current, else a holder's."""
        placement = self._admit(dataset, key)
        entry = self.index.peek((dataset, key))
        if entry is not None and (
            entry.version.hlc == hlc if hlc is not None else self._trusted_entry(placement, entry)
        ):
            return agent_pb2.ObjectInfo(
                dataset=dataset, key=key, version=version_to_wire(entry.version)
            )
        info, _ = await self._ask_holders(placement, dataset, key, hlc)
        return info

    async def _hit(
        self, placement: Placement, dataset: str, key: str, hlc: HLC | None
    ) -> ObjectReader | None:
        name = (dataset, key)
        filling = self._filling.get(name)
        if filling is not None:  # a prefetch (or another reader) is fetching it
            await filling.wait()
        entry = self.index.get(name)
        if entry is None or (hlc is not None and entry.version.hlc != hlc):
            return None
        if hlc is None and not self._trusted_entry(placement, entry):
            try:
                info, _ = await self._ask_holders(placement, dataset, key, None)
            except NotFoundError:
                await self._drop(entry, "deleted at the holders")
                raise
            if version_from_wire(info.version, "ObjectInfo.version") != entry.version:
                await self._drop(entry, "a newer version at the holders")
                return None
            if not entry.newest:
                # The holders say it is the newest: trusted as such from now on (the same
                # size, so nothing is evicted for it).
                entry = Entry(entry.dataset, entry.key, entry.version)
                for old in self.index.admit(entry):
                    await self._remove(old, "evicted")
        store = self._store()
        try:
            return await open_in_thread(
                functools.partial(store.open, dataset, key, entry.version.hlc)
            )
        except (NotFoundError, MissingContentError):
            self.index.remove(name)
            return None

    async def _miss(
        self, placement: Placement, dataset: str, key: str, hlc: HLC | None
    ) -> ObjectReader:
        entry = await self.fill(placement, dataset, key, hlc)
        if entry is None and hlc is None and self._known_stale(dataset, key):
            # The change log announced a newer version than the holder gave: once more.
            entry = await self.fill(placement, dataset, key, hlc)
        store = self._store()
        if entry is None:  # fetched, but known to be stale or larger than the bound
            held = await asyncio.to_thread(store.stat, dataset, key, hlc)
            reader = await open_in_thread(
                functools.partial(store.open, dataset, key, held.version.hlc)
            )
            try:
                await asyncio.to_thread(store.hand_off, dataset, key, held.version.hlc)
            except BaseException:
                reader.close()
                raise
            return reader  # the open file outlives its removal
        return await open_in_thread(functools.partial(store.open, dataset, key, entry.version.hlc))

    def _known_stale(self, dataset: str, key: str) -> bool:
        seen = self._seen.get((dataset, key))
        held = self._store().head(dataset, key)
        return seen is not None and held is not None and held.hlc < seen

    async def fill(
        self,
        placement: Placement,
        dataset: str,
        key: str,
        hlc: HLC | None,
        known: tuple[Source, Version] | None = None,
    ) -> Entry | None:
        """Fetch the newest version (or `hlc`; or `known`'s, from its source) into the
        cache: its entry, or None when it was stored but not kept (the change log knows
        a newer version, or it is larger than the bound). One fill per object at once."""
        name = (dataset, key)
        for _ in range(8):  # another fill of it ran meanwhile: its result, or ours
            running = self._filling.get(name)
            if running is None:
                break
            await running.wait()  # how it ended is its own caller's: look at the index
            held = self.index.peek(name)
            if held is not None and (hlc is None or held.version.hlc == hlc):
                return held
        done = self._filling[name] = asyncio.Event()
        try:
            entry = await self._fill(placement, dataset, key, hlc, known)
            if entry is None and known is not None:
                await self._forget_unkept(dataset, key, known[1])
            return entry
        finally:
            if self._filling.get(name) is done:
                del self._filling[name]
            done.set()

    async def _fill(
        self,
        placement: Placement,
        dataset: str,
        key: str,
        hlc: HLC | None,
        known: tuple[Source, Version] | None,
    ) -> Entry | None:
        store, book = self._store(), self._book()
        if known is not None:
            source, version = known
        else:
            info, source = await self._ask_holders(placement, dataset, key, hlc)
            version = version_from_wire(info.version, "ObjectInfo.version")
        try:
            await self._pull(store, book, source, dataset, key, version)
        finally:
            await self._ship_records()
        held = self.index.peek((dataset, key))
        if held is not None and held.version.hlc > version.hlc:
            # An older version asked by its HLC: the store kept the newer one (LWW), which
            # stays the entry (replacing it would lose its bytes from the bound's count).
            log.info("cache_fill_older", dataset=dataset, key=key, version=str(version.hlc))
            return None
        entry = Entry(dataset, key, version, newest=hlc is None)
        seen = self._seen.get((dataset, key))
        if seen is not None and version.hlc < seen:
            log.info("cache_fill_stale", dataset=dataset, key=key, version=str(version.hlc))
            return None
        if version.size > self.index.limit_bytes:
            return None
        policy = self.policy()
        if policy is not None and not self._may_hold(policy, dataset):
            # The residency narrowed while it was pulled (a sweep ran meanwhile, before
            # this entry existed): not admitted, so the sweep's verdict stands.
            log.info("cache_fill_outside_residency", dataset=dataset, key=key)
            return None
        for old in self.index.admit(entry):
            await self._remove(old, "evicted")
        log.debug("cache_filled", dataset=dataset, key=key, version=str(version.hlc))
        return entry

    async def _pull(
        self,
        store: ObjectStore,
        book: ResumeBook,
        source: Source,
        dataset: str,
        key: str,
        version: Version,
    ) -> None:
        """Copy `version` here from `source`, or from another agent of its region: the
        Stat or List that named it was routed across that region, but a transfer is
        served by the agent that holds the object, which need not be the one asked."""
        tried = [source.address]
        while True:
            try:
                await pull(
                    store,
                    book,
                    source,
                    dataset,
                    key,
                    version,
                    region=self.region,
                    metrics=self.metrics,
                    policy=self.policy,
                )
                return
            except NotFoundError:
                others = [a for a in await self.peers.addresses(source.region) if a not in tried]
                if not others:
                    raise
                source = Source(source.region, others[0])
                tried.append(source.address)

    async def _drop(self, entry: Entry, why: str) -> None:
        if self.index.peek(entry.name) == entry:
            self.index.remove(entry.name)
        await self._remove(entry, why)

    async def _forget_unkept(self, dataset: str, key: str, version: Version) -> None:
        """A prefetch's bytes that its fill did not keep (a newer version is known, or
        they exceed the bound): no index entry counts them and no reader asked for
        them, so they go now rather than sit outside the bound until a restart. Done
        before the fill ends: a reader waiting on it then fetches afresh. `hand_off`
        leaves them when a newer version is held (LWW kept that one)."""
        held = self.index.peek((dataset, key))
        if held is not None and held.version.hlc == version.hlc:
            return
        with contextlib.suppress(MeridianError):
            await asyncio.to_thread(self._store().hand_off, dataset, key, version.hlc)

    async def _remove(self, entry: Entry, why: str) -> None:
        self.cache_metrics.dropped(why)
        log.debug("cache_dropped", dataset=entry.dataset, key=entry.key, why=why)
        with contextlib.suppress(MeridianError):
            await asyncio.to_thread(
                self._store().hand_off, entry.dataset, entry.key, entry.version.hlc
            )

    # -- residency -----------------------------------------------------------------------

    async def drop_outside_residency(self) -> int:
        """Drop every entry of a dataset this region may no longer hold (a narrowed
        residency, a dataset no policy governs now); how many. A cached copy is in no
        catalog, so no audit reports it, and one of a dataset no longer read here stayed
        until evicted: run at each new policy revision (`ResidencySweeper`)."""
        policy = self.policy()
        if policy is None:
            return 0  # nothing is decided on no policy (its reads are refused meanwhile)
        verdicts: dict[str, bool] = {}
        dropped = 0
        for name in self.index.names():
            dataset = name[0]
            allowed = verdicts.get(dataset)
            if allowed is None:
                allowed = verdicts[dataset] = self._may_hold(policy, dataset)
            entry = None if allowed else self.index.remove(name)
            if entry is not None:
                await self._remove(entry, "residency")
                dropped += 1
        if dropped:
            log.info(
                "cache_residency_swept",
                dropped=dropped,
                datasets=sorted(d for d, ok in verdicts.items() if not ok),
                revision=policy.revision,
            )
        return dropped

    def _may_hold(self, policy: CompiledPolicy, dataset: str) -> bool:
        try:
            placement = self.admission.placement(dataset)
            return policy.jurisdiction(self.region) in placement.residency
        except (NotGovernedError, NotFoundError):
            return False  # fail closed, as a read would be refused
        except Exception as exc:  # noqa: BLE001 - undecidable: fail closed (a cache)
            log.warning("cache_residency_undecided", dataset=dataset, error=str(exc))
            return False

    def _admit(self, dataset: str, key: str) -> Placement:
        try:
            return self.admission.admit_store(dataset)  # counted and logged when refused
        except ResidencyError as exc:
            entry = self.index.remove((dataset, key))
            if entry is not None:  # a narrowed residency: the copy goes too
                with contextlib.suppress(MeridianError):
                    self._store().hand_off(dataset, key, entry.version.hlc)
            placement = self.admission.placement(dataset)
            tally = TransferTally(
                new_transfer_id(), dataset, key, placement.home, self.region, "in", method="cache"
            )
            record = tally.record("refused", self.policy, str(exc))
            with contextlib.suppress(MeridianError):
                self.journal.record_transfer(dataset, key, None, record)
            tally.count(self.metrics, "refused")
            raise CacheResidencyError(f"{exc} (not even as a cached copy)") from exc

    # -- holders -------------------------------------------------------------------------

    async def sources(self, placement: Placement) -> list[Source]:
        """An agent of each region holding the dataset, nearest first."""
        found: list[Source] = []
        for region in (placement.home, *placement.replicas):
            if region == self.region:
                continue
            with contextlib.suppress(UnavailableError):
                found.append(Source(region, await self.peers.address(region)))
        return order_sources(self.region, found, self.policy)

    async def _ask_holders(
        self, placement: Placement, dataset: str, key: str, hlc: HLC | None
    ) -> tuple[agent_pb2.ObjectInfo, Source]:
        """The object's newest version (or `hlc`) at the nearest holder that answers."""
        request = agent_pb2.StatRequest(dataset=dataset, key=key)
        if hlc is not None:
            request.version = hlc.text
        failures: list[str] = []
        missing: NotFoundError | None = None
        for source in await self.sources(placement):
            try:
                response: agent_pb2.StatResponse = await self._stub(source.address).Stat(
                    request, timeout=_STAT_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err, source.address)
                if isinstance(exc, NotFoundError):
                    missing = missing or exc
                    continue
                if not exc.retriable:
                    raise exc from err
                failures.append(f"{source.region}: {exc}")
                continue
            return response.object, source
        if missing is not None and not failures:
            raise NotFoundError(
                f"object {dataset}/{key} is held by none of its regions "
                f"({', '.join((placement.home, *placement.replicas))})"
            )
        raise UnavailableError(
            f"no holder of {dataset}/{key} answered this region's cache: "
            + ("; ".join(failures) or "no agent of its regions is registered")
        )

    async def list_after(
        self, source: Source, dataset: str, after: str, count: int
    ) -> Sequence[agent_pb2.ObjectInfo]:
        """The next `count` objects of `dataset` after key `after` at `source`."""
        request = agent_pb2.ListRequest(dataset=dataset, page_token=after, page_size=count)
        try:
            response: agent_pb2.ListResponse = await self._stub(source.address).List(
                request, timeout=_STAT_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, source.address) from err
        return list(response.objects)

    def _stub(self, address: str) -> agent_pb2_grpc.AgentAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address,
                # A holder that went away must fail the next call fast.
                options=[*CHANNEL_OPTIONS, ("grpc.max_reconnect_backoff_ms", 1000)],
            )
        return agent_pb2_grpc.AgentStub(channel)

    # -- records -------------------------------------------------------------------------

    async def _ship_records(self) -> None:
        """The cache store's transfer records, into the agent's journal (so the recorder
        ships them to the catalog); its version records are dropped: no replica."""

        def ship() -> None:
            store = self._store()
            for _ in range(100):
                pending = store.journal_pending()
                if not pending:
                    return
                for item in pending:
                    if item.kind == "transfer" and item.dataset is not None:
                        data = dict(item.data)
                        data["method"] = f"cache-{data.get('method') or 'raw'}"
                        self.journal.record_transfer(item.dataset, item.key, item.hlc, data)
                store.journal_shipped(pending[-1].seq)

        try:
            await asyncio.to_thread(ship)
        except MeridianError as exc:
            log.warning("cache_records_unshipped", error=str(exc))

    def _store(self) -> ObjectStore:
        if self.store is None:
            raise UnavailableError("the read cache is not started")
        return self.store

    def _book(self) -> ResumeBook:
        if self.book is None:
            raise UnavailableError("the read cache is not started")
        return self.book
