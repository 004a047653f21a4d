"""`RoutedAgentService`: the agent API of one agent in a region of several.

Each object has `r` owners among the region's serving agents (agents/placement),
the first of them its primary. Any agent takes any call:

- **Put, Delete**: committed by the primary (this agent when it is the primary;
  otherwise the call is forwarded to it, one hop, marked as routed so it is served
  there whatever that agent's view of the placement), which then has the other
  owners pull the new version (copies.py) and acks only once `r` agents hold it, on
  top of the class's cross-region rules (a critical write's replication runs in the
  committing agent, as before). A primary that cannot be reached is passed over for
  the next owner while nothing of the stream has been sent.
- **Get, Stat**: served by the first owner (this one first when it is an owner) that
  holds the object; while a rebalance moves it, the agents that held it before still
  do, so they are asked next: a reader never sees it missing.
- **List**: every agent of the region is asked for the same page and the answers
  are merged by key (the newest version of each), so a listing covers the region.
  An agent that does not answer is skipped (its objects have r-1 other copies),
  unless the request asks for a `complete` listing: then the call fails.
- **Rewind** (a critical takeover): every agent of the region is asked to drop the
  version, and all must answer; the answer says whether one dropped it.

Version sets (a Put or Get naming a set, CommitSet) stay on the agent that takes
them, as in a region of one agent: a set is committed only where every member is
stored. **GetSet** is asked of every agent of the region and answers the newest
complete record found (of the named set, or "latest"), so a reader, or a critical
owner's takeover proof, sees a set whichever agent took it; its members are read by
version, which routed Gets find. A region of ONE agent (no other registration) is
served exactly as before: no hop, no copy.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Protocol, TypeVar

import grpc

from agents.admission import Admission
from agents.metrics import AgentMetrics
from agents.placement import departures, hrw
from agents.placement.members import Member, Members
from agents.routing.copies import fetch_to, place_copies
from agents.routing.peers import PeerStubs, routed_by
from agents.rpc.status import abort, from_rpc_error
from agents.service import requests
from agents.service.outcome import Context, stream, unary
from agents.service.servicer import (
    AgentService,
    ReadThrough,
    Replication,
    SetReceiver,
    Transfers,
    check_small,
)
from agents.store import ObjectStore
from agents.store.errors import DeletedError
from controlplane.domain.hlc import HLC
from controlplane.errors import MeridianError, NotFoundError, UnavailableError
from controlplane.logs import get_logger
from meridian.convert import version_from_wire
from meridian.v1 import agent_pb2, types_pb2

log = get_logger("meridian.agent.routing")

_F = TypeVar("_F", agent_pb2.PutRequest, agent_pb2.ReplicateRequest)
_R = TypeVar("_R")

# A fan-out call to a peer (routed List, Rewind) at most this long, and this long when
# the caller set no deadline.
FAN_OUT_TIMEOUT_S = 30.0


def fan_out_timeout(context: Context) -> float:
    """A peer's share of the caller's call: what is left of its deadline, at most
    `FAN_OUT_TIMEOUT_S`. A fixed 30 s outlived a proof's deadline of a few seconds: the
    caller gave up, and the peers' calls went on (a paused agent held each for 30 s)."""
    remaining = context.time_remaining()
    if remaining is None:
        return FAN_OUT_TIMEOUT_S
    return max(0.0, min(remaining, FAN_OUT_TIMEOUT_S))


class MembersSource(Protocol):
    """The region's current member snapshot (agents/placement/watch.py)."""

    @property
    def current(self) -> Members: ...


class DeparturesSource(Protocol):
    """The region's departed agents, read fresh (agents/placement/roster.py)."""

    async def departed(self, members: Members) -> list[str]: ...


class RoutedAgentService(AgentService):
    """See the module docstring. `endpoint` (where peers reach this agent) is set by the
    daemon once the server listens; until then, and while this agent is alone in its
    region, every call is served here as by `AgentService`."""

    def __init__(
        self,
        store: ObjectStore,
        admission: Admission,
        region: str,
        agent_id: str,
        metrics: AgentMetrics,
        transfers: Transfers | None = None,
        *,
        members: MembersSource,
        peers: PeerStubs,
        replication: Replication | None = None,
        sets: SetReceiver | None = None,
        max_object_bytes: int | None = None,
        cache: ReadThrough | None = None,
    ) -> None:
        super().__init__(
            store,
            admission,
            region,
            agent_id,
            metrics,
            transfers,
            replication=replication,
            sets=sets,
            max_object_bytes=max_object_bytes,
            cache=cache,
        )
        self.members = members
        self.peers = peers
        self.endpoint = ""
        # The region's roster (agents/placement/roster.py), set by the daemon: a
        # complete listing is refused while an agent of the region has departed.
        self.roster: DeparturesSource | None = None

    def _region_view(self) -> Members | None:
        """The members when another agent shares the region (None: serve alone)."""
        current = self.members.current
        if not self.endpoint or all(a == self.agent_id for a in current.all):
            return None
        return current

    def _ranked(self, members: Members, dataset: str, key: str) -> list[Member]:
        """Every serving agent in the object's placement order (its owners first)."""
        return hrw.rank(hrw.placement_key(dataset, key), members.serving)

    def _placed_after_commit(self, dataset: str, key: str) -> tuple[list[Member], int]:
        """The object's serving agents and copy count as the membership stands once the
        write is committed here, not as it stood when the call began: a long upload may
        outlive this agent's serving (a drain began meanwhile), and a write committed
        after the drain's scan of the store must reach `r` serving agents by itself."""
        members = self.members.current
        return self._ranked(members, dataset, key), members.r

    def _read_plan(
        self, members: Members, dataset: str, key: str
    ) -> tuple[list[Member], frozenset[str]]:
        """`_read_order`, and the agent ids whose answer about the object is final: the
        owners (for a read through the cache, the dataset's primary)."""
        order = self._read_order(members, dataset, key)
        if self._cache_for(dataset, None) is not None and members.serving:
            return order, frozenset({order[0].agent_id})
        ranked = self._ranked(members, dataset, key)
        return order, frozenset(m.agent_id for m in ranked[: members.r])

    def _read_order(self, members: Members, dataset: str, key: str) -> list[Member]:
        """Where to look for an object: its owners, this agent among them first, then the
        other agents (which hold it while a rebalance moves it to new owners). A read
        through the cache (a dataset this region holds no replica of) goes to the
        dataset's primary alone, which caches it (so the region caches each object
        once, and the agent that sees a reader walk the dataset is the one whose
        prefetches it reads), and to this agent when that one cannot be reached."""
        if self._cache_for(dataset, None) is not None and members.serving:
            primary = self._ranked(members, dataset, "")[0]
            if primary.agent_id == self.agent_id:
                return [primary]
            me = members.get(self.agent_id)
            return [primary] if me is None else [primary, me]
        ranked = self._ranked(members, dataset, key)
        owners, others = ranked[: members.r], ranked[members.r :]
        owners.sort(key=lambda m: m.agent_id != self.agent_id)  # stable: self, then rank
        serving = {m.agent_id for m in ranked}
        leaving = [m for _, m in sorted(members.all.items()) if m.agent_id not in serving]
        return owners + others + leaving

    # -- writes --------------------------------------------------------------------------

    async def Put(  # noqa: N802 - the generated name
        self, request_iterator: AsyncIterator[agent_pb2.PutRequest], context: Context
    ) -> agent_pb2.PutResponse:
        members = self._region_view()
        if members is None:
            return await super().Put(request_iterator, context)
        return await unary(
            "Put",
            context,
            self.metrics,
            lambda: self._routed_put(members, request_iterator, context),
        )

    async def PutSmall(  # noqa: N802 - the generated name
        self, request: agent_pb2.PutSmallRequest, context: Context
    ) -> agent_pb2.PutResponse:
        members = self._region_view()
        if members is None:
            return await super().PutSmall(request, context)

        # In a region of several agents it goes where a Put goes (forwarded as a Put to
        # the key's primary, placed on the key's other owners), its frames made here.
        async def routed() -> agent_pb2.PutResponse:
            check_small(request, self.max_object_bytes)
            return await self._routed_put(members, _small_frames(request), context)

        return await unary("PutSmall", context, self.metrics, routed)

    async def _routed_put(
        self,
        members: Members,
        frames: AsyncIterator[agent_pb2.PutRequest],
        context: Context,
    ) -> agent_pb2.PutResponse:
        first = await anext(frames, None)
        if first is None or first.WhichOneof("frame") != "header" or first.header.HasField("set"):
            # Refused as a lone agent refuses it, or a set member: stored here.
            return await self._put(_chain(first, frames), context)
        dataset, key = first.header.dataset, first.header.key
        ranked = self._ranked(members, dataset, key)
        if routed_by(context) is not None or not ranked or ranked[0].agent_id == self.agent_id:
            return await self._put_here(first, frames, context)
        sent = _Counted(first, frames)
        failures: list[str] = []
        for target in ranked[: members.r]:
            if target.agent_id == self.agent_id:  # the primary is gone: commit here
                return await self._put_here(first, sent.rest(), context)
            try:
                response: agent_pb2.PutResponse = await self.peers.stub(target.endpoint).Put(
                    sent.frames(),
                    timeout=context.time_remaining(),
                    metadata=self.peers.metadata,
                )
                return response
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err, target.endpoint)
                if not exc.retriable or sent.consumed:
                    raise exc from err
                failures.append(f"{target.agent_id}: {exc}")
        raise UnavailableError(
            f"no owner of {dataset}/{key} in {self.region} took the write: " + "; ".join(failures)
        )

    async def _put_here(
        self,
        first: agent_pb2.PutRequest,
        frames: AsyncIterator[agent_pb2.PutRequest],
        context: Context,
    ) -> agent_pb2.PutResponse:
        response = await self._put(_chain(first, frames), context)
        version = version_from_wire(response.version, "PutResponse.version")
        ranked, r = self._placed_after_commit(first.header.dataset, first.header.key)
        await place_copies(
            self.peers,
            ranked,
            r,
            self.agent_id,
            first.header.dataset,
            first.header.key,
            version,
            region=self.region,
            source=self.endpoint,
        )
        return response

    async def Delete(  # noqa: N802
        self, request: agent_pb2.DeleteRequest, context: Context
    ) -> agent_pb2.DeleteResponse:
        members = self._region_view()
        if members is None or request.HasField("set"):
            return await super().Delete(request, context)
        return await unary(
            "Delete", context, self.metrics, lambda: self._routed_delete(members, request, context)
        )

    async def _routed_delete(
        self, members: Members, request: agent_pb2.DeleteRequest, context: Context
    ) -> agent_pb2.DeleteResponse:
        ranked = self._ranked(members, request.dataset, request.key)
        targets = ranked[: members.r]
        if routed_by(context) is None and targets and targets[0].agent_id != self.agent_id:
            failures: list[str] = []
            for target in targets:
                if target.agent_id == self.agent_id:
                    break  # the owners before this one are gone: commit here
                try:
                    response: agent_pb2.DeleteResponse = await self.peers.stub(
                        target.endpoint
                    ).Delete(
                        request, timeout=context.time_remaining(), metadata=self.peers.metadata
                    )
                    return response
                except grpc.aio.AioRpcError as err:
                    exc = from_rpc_error(err, target.endpoint)
                    if not exc.retriable:
                        raise exc from err
                    failures.append(f"{target.agent_id}: {exc}")
            else:
                raise UnavailableError(
                    f"no owner of {request.dataset}/{request.key} in {self.region} took the "
                    "delete: " + "; ".join(failures)
                )
        response = await self._delete(request, context)
        version = version_from_wire(response.version, "DeleteResponse.version")
        ranked, r = self._placed_after_commit(request.dataset, request.key)
        await place_copies(
            self.peers,
            ranked,
            r,
            self.agent_id,
            request.dataset,
            request.key,
            version,
            region=self.region,
            source=self.endpoint,
        )
        return response

    # -- copies from other regions (the replicator's Fetch, a critical Replicate) ---------

    async def Fetch(  # noqa: N802
        self, request: agent_pb2.FetchRequest, context: Context
    ) -> agent_pb2.FetchResponse:
        members = self._region_view()
        response = await super().Fetch(request, context)
        if members is not None and routed_by(context) is None and response.HasField("held"):
            await self._spread(members, request.dataset, request.key, response.held, context)
        return response

    async def Replicate(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.ReplicateRequest], context: Context
    ) -> agent_pb2.ReplicateResponse:
        members = self._region_view()
        first = await anext(request_iterator, None)
        response = await super().Replicate(_chain(first, request_iterator), context)
        if (
            members is not None
            and routed_by(context) is None
            and first is not None
            and first.WhichOneof("frame") == "header"
            and response.HasField("version")
        ):
            header = first.header
            await self._spread(members, header.dataset, header.key, response.version, context)
        return response

    async def _spread(
        self,
        members: Members,
        dataset: str,
        key: str,
        wire: types_pb2.Version,
        context: Context,
    ) -> None:
        """A version another region sent here is copied to the object's owners in this
        region before the call is answered (this agent, if no owner, hands its copy to
        them at its next rebalance pass)."""
        try:
            version = version_from_wire(wire, "held")
            ranked = self._ranked(members, dataset, key)
            owners = [m for m in ranked[: members.r] if m.agent_id != self.agent_id]
            for owner in owners:
                await fetch_to(
                    self.peers,
                    owner,
                    dataset,
                    key,
                    version,
                    region=self.region,
                    source=self.endpoint,
                )
        except MeridianError as exc:
            await abort(context, exc)

    # -- reads ---------------------------------------------------------------------------

    async def Get(  # noqa: N802
        self, request: agent_pb2.GetRequest, context: Context
    ) -> AsyncIterator[agent_pb2.GetResponse]:
        members = self._region_view()
        if members is None or routed_by(context) is not None or request.HasField("set"):
            async for msg in super().Get(request, context):
                yield msg
            return
        async for msg in stream("Get", context, self.metrics, self._routed_get(members, request)):
            yield msg

    async def _routed_get(
        self, members: Members, request: agent_pb2.GetRequest
    ) -> AsyncIterator[agent_pb2.GetResponse]:
        order, owners = self._read_plan(members, request.dataset, request.key)
        answers = _Answers(owners)
        for member in order:
            source: AsyncIterator[agent_pb2.GetResponse]
            if member.agent_id == self.agent_id:
                source = self._get(request)
            else:
                source = _remote_get(self.peers, member, request)
            try:
                first = await anext(source)
            except StopAsyncIteration:
                continue
            except MeridianError as exc:
                answers.failed(member, exc)
                continue
            if first.HasField("header") and answers.older(
                version_from_wire(first.header, "GetResponse.header").hlc
            ):
                # An older copy than a tombstone seen: not served (its stream is ended).
                closing = getattr(source, "aclose", None)
                if closing is not None:
                    await closing()
                continue
            yield first
            async for msg in source:
                yield msg
            return
        raise answers.final(
            f"object {request.dataset}/{request.key} is not stored in {self.region}"
        )

    async def Stat(  # noqa: N802
        self, request: agent_pb2.StatRequest, context: Context
    ) -> agent_pb2.StatResponse:
        members = self._region_view()
        if members is None or routed_by(context) is not None:
            return await super().Stat(request, context)
        return await unary(
            "Stat", context, self.metrics, lambda: self._routed_stat(members, request)
        )

    async def _routed_stat(
        self, members: Members, request: agent_pb2.StatRequest
    ) -> agent_pb2.StatResponse:
        order, owners = self._read_plan(members, request.dataset, request.key)
        answers = _Answers(owners)
        for member in order:
            try:
                if member.agent_id == self.agent_id:
                    response = await self._stat(request)
                else:
                    try:
                        response = await self.peers.stub(member.endpoint).Stat(
                            request, timeout=10.0, metadata=self.peers.metadata
                        )
                    except grpc.aio.AioRpcError as err:
                        raise from_rpc_error(err, member.endpoint) from err
            except MeridianError as exc:
                answers.failed(member, exc)
                continue
            version = version_from_wire(response.object.version, "StatResponse.object.version")
            if not answers.older(version.hlc):  # else older than a tombstone seen
                return response
        raise answers.final(
            f"object {request.dataset}/{request.key} is not stored in {self.region}"
        )

    async def GetSet(  # noqa: N802
        self, request: agent_pb2.GetSetRequest, context: Context
    ) -> agent_pb2.GetSetResponse:
        members = self._region_view()
        if routed_by(context) is not None:
            return await super().GetSet(request, context)
        if members is None:
            if self.roster is not None:
                # The lone survivor too: a departed agent may hold the set.
                return await unary(
                    "GetSet", context, self.metrics, lambda: self._lone_get_set(request)
                )
            return await super().GetSet(request, context)
        return await unary(
            "GetSet",
            context,
            self.metrics,
            lambda: self._routed_get_set(members, request, fan_out_timeout(context)),
        )

    async def _lone_get_set(self, request: agent_pb2.GetSetRequest) -> agent_pb2.GetSetResponse:
        try:
            return await self._get_set(request)
        except NotFoundError:
            await self._refuse_departed(f"set {request.set} of {request.dataset}")
            raise

    async def _routed_get_set(
        self, members: Members, request: agent_pb2.GetSetRequest, timeout_s: float
    ) -> agent_pb2.GetSetResponse:
        """The newest complete record of the set among the region's agents. Nothing
        found: retriable when an agent did not answer, or holds the set incomplete (it
        may show it soon), or has departed (agents/placement/departures.py: it may hold
        the set), else not found."""
        deadline = time.monotonic() + timeout_s
        answers: list[agent_pb2.GetSetResponse | MeridianError] = []
        try:
            answers.append(await self._get_set(request))  # validates the request, as alone
        except MeridianError as exc:
            if not (isinstance(exc, NotFoundError) or exc.retriable):
                raise
            answers.append(exc)
        others = [m for _, m in sorted(members.all.items()) if m.agent_id != self.agent_id]
        # The peers get what the local read left of the caller's deadline, not a fresh one.
        left_s = max(0.0, deadline - time.monotonic())
        remote = await asyncio.gather(
            *(self._remote_get_set(m, request, left_s) for m in others), return_exceptions=True
        )
        for answer in remote:
            if isinstance(answer, MeridianError):
                answers.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                answers.append(answer)
        found = [a for a in answers if isinstance(a, agent_pb2.GetSetResponse)]
        if found:
            return max(found, key=lambda a: a.set.hlc)  # HLC text sorts
        failed = [a for a in answers if isinstance(a, MeridianError)]
        if any(not isinstance(e, NotFoundError) for e in failed):
            for e in failed:
                if not (isinstance(e, NotFoundError) or e.retriable):
                    raise e
            raise UnavailableError(
                f"set {request.set} of {request.dataset} is shown by no agent of {self.region} "
                "now, and not every agent could say it holds none: "
                + "; ".join(str(e) for e in failed if not isinstance(e, NotFoundError))
            )
        await self._refuse_departed(f"set {request.set} of {request.dataset}")
        wanted = "no complete version set" if request.set == "latest" else f"no set {request.set}"
        raise NotFoundError(f"dataset {request.dataset} has {wanted} in {self.region}")

    async def _remote_get_set(
        self, member: Member, request: agent_pb2.GetSetRequest, timeout_s: float
    ) -> agent_pb2.GetSetResponse:
        stub = self.peers.stub(member.endpoint)
        return await _answer(
            member.endpoint,
            stub.GetSet(request, timeout=timeout_s, metadata=self.peers.metadata),
        )

    async def List(  # noqa: N802
        self, request: agent_pb2.ListRequest, context: Context
    ) -> agent_pb2.ListResponse:
        members = self._region_view()
        if routed_by(context) is not None:
            return await super().List(request, context)
        if members is None:
            if request.complete and self.roster is not None:
                # The lone survivor too: what a departed agent held is on no one here.
                return await unary(
                    "List", context, self.metrics, lambda: self._lone_complete_list(request)
                )
            return await super().List(request, context)
        return await unary(
            "List",
            context,
            self.metrics,
            lambda: self._routed_list(members, request, fan_out_timeout(context)),
        )

    async def _refuse_departed(self, what: str) -> None:
        """Fail retriable while an agent of the region has departed (a roster entry, no
        registration: agents/placement/departures.py): it may hold the only copy of the
        version a proof would call lone, or of the set it would call absent."""
        if self.roster is None:
            return
        gone = await self.roster.departed(self.members.current)
        if gone:
            log.warning("refused_departed", region=self.region, departed=gone, read=what)
            raise UnavailableError(departures.refusal(self.region, gone))

    async def _lone_complete_list(self, request: agent_pb2.ListRequest) -> agent_pb2.ListResponse:
        requests.list_query(request)  # a bad request is refused as bad, departures or not
        await self._refuse_departed(f"complete listing of {request.dataset}")
        return await self._list(request)

    async def _routed_list(
        self, members: Members, request: agent_pb2.ListRequest, timeout_s: float
    ) -> agent_pb2.ListResponse:
        deadline = time.monotonic() + timeout_s
        limit = requests.list_query(request).limit
        if request.complete:
            await self._refuse_departed(f"complete listing of {request.dataset}")
        local = await self._list(request)
        others = [m for _, m in sorted(members.all.items()) if m.agent_id != self.agent_id]
        # The peers get what the local part left of the caller's deadline, not a fresh one.
        left_s = max(0.0, deadline - time.monotonic())
        answers = await asyncio.gather(
            *(self._remote_list(m, request, left_s) for m in others), return_exceptions=True
        )
        pages = [local]
        for member, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, MeridianError) and answer.retriable and request.complete:
                    # A proof (a critical takeover) must not read "held nowhere" from
                    # a listing that missed an agent: the one that holds it.
                    raise UnavailableError(
                        f"the listing of {request.dataset} in {self.region} is incomplete: "
                        f"agent {member.agent_id} did not answer ({answer})"
                    ) from answer
                if isinstance(answer, MeridianError) and answer.retriable:
                    # Its objects have r-1 other copies: listed from those.
                    log.warning("list_peer_unreachable", agent=member.agent_id, error=str(answer))
                    continue
                raise answer
            pages.append(answer)
        newest: dict[str, agent_pb2.ObjectInfo] = {}
        more = False
        for page in pages:
            more = more or bool(page.next_page_token)
            for info in page.objects:
                held = newest.get(info.key)
                # HLC text sorts as HLCs do. Of equal versions, `lowest` (a proof that
                # every agent holds it) takes one whose bytes were lost.
                if (
                    held is None
                    or (request.lowest and info.version.hlc < held.version.hlc)
                    or (not request.lowest and info.version.hlc > held.version.hlc)
                    or (
                        request.lowest
                        and info.version.hlc == held.version.hlc
                        and info.missing
                        and not held.missing
                    )
                ):
                    newest[info.key] = info
        keys = sorted(newest)
        chosen = keys[:limit]
        token = chosen[-1] if chosen and (more or len(keys) > limit) else ""
        return agent_pb2.ListResponse(
            objects=[newest[k] for k in chosen], next_page_token=token, lowest=request.lowest
        )

    async def _remote_list(
        self, member: Member, request: agent_pb2.ListRequest, timeout_s: float
    ) -> agent_pb2.ListResponse:
        stub = self.peers.stub(member.endpoint)
        return await _answer(
            member.endpoint, stub.List(request, timeout=timeout_s, metadata=self.peers.metadata)
        )

    # -- Rewind (a critical owner's takeover pass drops a deposed owner's lone write) -----

    async def Rewind(  # noqa: N802
        self, request: agent_pb2.RewindRequest, context: Context
    ) -> agent_pb2.RewindResponse:
        members = self._region_view()
        if members is None or routed_by(context) is not None:
            return await super().Rewind(request, context)
        return await unary(
            "Rewind",
            context,
            self.metrics,
            lambda: self._routed_rewind(members, request, fan_out_timeout(context)),
        )

    async def _routed_rewind(
        self, members: Members, request: agent_pb2.RewindRequest, timeout_s: float
    ) -> agent_pb2.RewindResponse:
        """Every agent of the region drops the version (each fences the call itself), this
        one too (through its own endpoint, marked as routed: served there as alone): the
        owner listed it from the region, so any of them may hold it, an owner of the key
        or one that held it before a rebalance. All must answer, or the call fails
        retriable (an agent not asked may still hold it); `dropped` when one dropped it,
        `newest` the newest any holds now."""
        targets = [m for _, m in sorted(members.all.items())]
        answers = await asyncio.gather(
            *(self._remote_rewind(m, request, timeout_s) for m in targets), return_exceptions=True
        )
        merged = agent_pb2.RewindResponse(region=self.region)
        failures: list[str] = []
        for member, answer in zip(targets, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, MeridianError) and not answer.retriable:
                    raise answer  # a fence: this caller is no longer the owner
                failures.append(f"{member.agent_id}: {answer}")
                continue
            merged.dropped = merged.dropped or answer.dropped
            if answer.HasField("newest") and (
                not merged.HasField("newest") or answer.newest.hlc > merged.newest.hlc
            ):  # HLC text sorts
                merged.newest.CopyFrom(answer.newest)
        if failures:
            raise UnavailableError(
                f"the rewind of {request.dataset}/{request.key} did not reach every agent of "
                f"{self.region} (dropped where it did: {merged.dropped}): " + "; ".join(failures)
            )
        return merged

    async def _remote_rewind(
        self, member: Member, request: agent_pb2.RewindRequest, timeout_s: float
    ) -> agent_pb2.RewindResponse:
        endpoint = self.endpoint if member.agent_id == self.agent_id else member.endpoint
        stub = self.peers.stub(endpoint)
        return await _answer(
            endpoint, stub.Rewind(request, timeout=timeout_s, metadata=self.peers.metadata)
        )


async def _answer(endpoint: str, call: Awaitable[_R]) -> _R:
    """A peer's answer to a unary call; its failure as the error it carries (a fence, a
    not found), or retriable when the peer could not be reached."""
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, endpoint) from err


async def _remote_get(
    peers: PeerStubs, member: Member, request: agent_pb2.GetRequest
) -> AsyncIterator[agent_pb2.GetResponse]:
    call = peers.stub(member.endpoint).Get(request, metadata=peers.metadata)
    try:
        async for msg in call:
            yield msg
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, member.endpoint) from err
    finally:
        call.cancel()  # a reader that stops early must not leave the stream open


async def _chain(first: _F | None, rest: AsyncIterator[_F]) -> AsyncIterator[_F]:
    if first is not None:
        yield first
    async for frame in rest:
        yield frame


class _Counted:
    """A Put's frames, forwarded. What was taken from the caller's stream is kept (up
    to `_REPLAY_BYTES`), so the Put can be sent again to the next owner when the first
    fails before answering: a small object is never refused because its primary died."""

    def __init__(
        self, first: agent_pb2.PutRequest, rest: AsyncIterator[agent_pb2.PutRequest]
    ) -> None:
        self.first = first
        self._rest = rest
        self._kept: list[agent_pb2.PutRequest] = []
        self._kept_bytes = 0
        self.consumed = False  # frames were taken that can no longer be replayed

    async def frames(self) -> AsyncIterator[agent_pb2.PutRequest]:
        yield self.first
        for frame in list(self._kept):
            yield frame
        async for frame in self._rest:
            if not self.consumed:
                self._kept_bytes += len(frame.chunk)
                if self._kept_bytes <= _REPLAY_BYTES:
                    self._kept.append(frame)
                else:
                    self.consumed, self._kept = True, []
            yield frame

    def rest(self) -> AsyncIterator[agent_pb2.PutRequest]:
        """What is left for a commit here: the kept frames, then the caller's."""
        return _chain_many(list(self._kept), self._rest)


# A forwarded Put whose first owner failed is sent again if at most this much of it
# had been read from the caller.
_REPLAY_BYTES = 8 * 1024 * 1024


async def _chain_many(
    kept: list[agent_pb2.PutRequest], rest: AsyncIterator[agent_pb2.PutRequest]
) -> AsyncIterator[agent_pb2.PutRequest]:
    for frame in kept:
        yield frame
    async for frame in rest:
        yield frame


async def _small_frames(request: agent_pb2.PutSmallRequest) -> AsyncIterator[agent_pb2.PutRequest]:
    """A PutSmall as the frames of a Put of the same object."""
    yield agent_pb2.PutRequest(header=request.header)
    if request.data:
        yield agent_pb2.PutRequest(chunk=request.data)
    yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())


class _Answers:
    """What the agents asked for an object said, while none served it; `final` is the
    error the read ends with. A tombstone is remembered (the newest seen): a copy no
    newer than it is not served (one a rebalance had not yet dropped), a newer one is
    (a put after the delete, on an owner the tombstone's holder lagged). An owner that
    could not be reached makes "not found" unknowable (retriable), whatever the others
    said; else deleted, else not found. Any other error is raised at once."""

    def __init__(self, owners: frozenset[str]) -> None:
        self.owners = owners
        self.missing: NotFoundError | None = None
        self.unreachable: MeridianError | None = None
        self.deleted: DeletedError | None = None
        self.tombstone: HLC | None = None

    def failed(self, member: Member, exc: MeridianError) -> None:
        owner = member.agent_id in self.owners
        if isinstance(exc, DeletedError):
            hlc = _tombstone_of(exc)
            if hlc is not None and (self.tombstone is None or hlc > self.tombstone):
                self.tombstone, self.deleted = hlc, exc
            self.missing = self.missing or exc
        elif isinstance(exc, NotFoundError):
            self.missing = self.missing or exc
        elif exc.retriable:
            if owner:
                self.unreachable = self.unreachable or exc
        else:
            raise exc

    def older(self, hlc: HLC) -> bool:
        """Whether a copy at `hlc` is no newer than a tombstone seen (not to be served)."""
        return self.tombstone is not None and hlc <= self.tombstone

    def final(self, what: str) -> MeridianError:
        return self.unreachable or self.deleted or self.missing or NotFoundError(what)


_TOMBSTONE = re.compile(r"\(tombstone (\S+)\)$")


def _tombstone_of(exc: DeletedError) -> HLC | None:
    """The tombstone's HLC a DeletedError names (its message, as the store words it and
    gRPC carries it); None when it names none."""
    found = _TOMBSTONE.search(str(exc))
    if found is None:
        return None
    try:
        return HLC.parse(found.group(1))
    except MeridianError:
        return None
