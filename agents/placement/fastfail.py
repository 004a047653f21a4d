"""Fast failure detection: a crashed agent is marked down by its peers at once.

A registration lives on a lease (agents/daemon/registration.py), so a SIGKILLed
agent stays listed, and owns its objects, until the lease lapses: up to a TTL and
more. But when the process dies and its host lives, the kernel closes its sockets
and refuses new connections to its port: a *definite* signal, unlike a timeout.
Ceph acts on it (`osd_fast_fail_on_connection_refused`); so does this module.

Who watches whom (bounded): each agent orders the region's registrations by id and
watches the next `neighbours` (2) after itself, cyclically, so each agent is watched
by two peers and holds two streams, whatever the region's size. A watch is one
long-lived grpc.health.v1 `Watch` stream on a channel of its own: nothing travels
while the peer lives, and the stream breaks the moment its process dies.

When a stream breaks, the watcher probes the peer's registered endpoint with a
plain TCP connect, and marks it down only when:

- the watcher has seen that peer answer SERVING on this registration before (an
  address that never answered, such as a wrong `--advertise`, is left to the lease,
  so a misconfigured agent is not removed over and over);
- every address the endpoint resolves to refuses the connection, and still does
  when asked again `confirm_after_s` later. A timeout, a reset, an unreachable
  network or a successful connect is never a verdict: a partitioned or paused
  (SIGSTOPped) agent, whose kernel still accepts connections, falls back to its
  lease exactly as before.

Two watchers must agree (where the peer has two): a watcher whose refusal is
confirmed votes in etcd (`/meridian/fast-fail/<region>/<agent>/<lease>/<voter>`, on a
short lease of its own) and marks the peer down only once the votes of `agreement`
distinct watchers are there. So a fault between one watcher and its peer (a firewall
rule that rejects, a route that answers with a reset) never removes a live agent that
its other watcher still sees. The votes of two watchers meet whatever their order:
each writes its own before it reads the others'. A peer whose other watcher died with
it gets no agreement and falls back to its lease.

Marking down revokes the lease the watched registration was on (`Member.lease`),
not the key: an agent restarted on the same address re-registers on a new lease
under the same key, and etcd detaches a key from its old lease when it is put on a
new one, so a late report about the predecessor removes nothing of its successor.
A registered agent always listens (it registers after its server starts and
deregisters before it stops), so a refusal means the process is gone.

A region of one agent has no peers, hence no streams and no probes. Metrics (on the
agent's registry): `meridian_fast_fail_total{outcome}` and
`meridian_fast_fail_watched_peers` (see `FastFailMetrics`).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.placement.members import Member, Members
from agents.placement.watch import MembershipWatch
from controlplane.coordination.protocols import keys
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.ports.coordination import Cmp, Compare, Coordination, Put, Target

log = get_logger("meridian.agent.placement")

# Each agent watches this many peers (the next ones after it by id).
NEIGHBOURS = 2
# The second connect that confirms a refusal comes this long after the first.
CONFIRM_AFTER_S = 0.15
PROBE_TIMEOUT_S = 1.0
# Watchers that must have voted a peer down (fewer where it has fewer watchers).
AGREEMENT = 2
# How long a voter waits for the other votes, and how long its vote counts: a watch that
# keeps breaking votes again, so agreement may also come from a later attempt.
AGREE_WAIT_S = 1.5
VOTE_TTL_S = 5
VOTE_POLL_S = 0.03
# Beside the votes' folder (not in it), the key of the one voter that revokes.
CLAIM_SUFFIX = ".revoke"

OUTCOMES = (
    "marked_down",
    "not_confirmed",
    "not_agreed",
    "answered",
    "unreachable",
    "superseded",
    "failed",
)


class Probe(StrEnum):
    """What one TCP connect to a peer's endpoint said."""

    REFUSED = "refused"  # every address refused: nothing listens there
    ANSWERED = "answered"  # something accepted the connection
    UNKNOWN = "unknown"  # a timeout, a reset, no route, no name: no verdict


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` as (host, port); ValueError when it is neither."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not host:port: {endpoint!r}")
    return host.strip("[]"), int(port)


async def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Connect to `endpoint` once per address it resolves to (see `Probe`)."""
    try:
        host, port = split_endpoint(endpoint)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, TimeoutError):
        return Probe.UNKNOWN
    if not infos:
        return Probe.UNKNOWN
    refused = 0
    for family, kind, proto, _, address in infos:
        outcome = await _connect(family, kind, proto, address, timeout_s)
        if outcome is Probe.ANSWERED:
            return outcome
        refused += outcome is Probe.REFUSED
    return Probe.REFUSED if refused == len(infos) else Probe.UNKNOWN


async def _connect(
    family: int, kind: int, proto: int, address: tuple[object, ...], timeout_s: float
) -> Probe:
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.get_running_loop().sock_connect(sock, address)
    except ConnectionRefusedError:
        return Probe.REFUSED
    except (OSError, TimeoutError):
        return Probe.UNKNOWN
    finally:
        sock.close()
    return Probe.ANSWERED


class FastFailMetrics:
    """- `meridian_fast_fail_total{outcome}`: what the checks after a broken watch found:
      `marked_down` (refused twice: the registration's lease was revoked),
      `not_confirmed` (refused, then not), `not_agreed` (refused twice, but the peer's
      other watcher did not vote it down in time), `answered` (the port accepts: watched
      again), `unreachable` (no verdict: left to the lease), `superseded` (the
      registration had gone or changed meanwhile), `failed` (etcd did not take it);
    - `meridian_fast_fail_watched_peers`: the peers this agent watches now."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.checks = Counter(
            "meridian_fast_fail_total",
            "checks of a peer whose health watch broke, by outcome",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.checks.labels(outcome=outcome)
        self.watched = Gauge(
            "meridian_fast_fail_watched_peers",
            "region peers this agent holds a health watch on",
            registry=registry,
        )


def neighbours(members: Members, agent_id: str, count: int = NEIGHBOURS) -> list[Member]:
    """The `count` registrations after `agent_id` in id order, cyclically (never itself)."""
    others = sorted(i for i in members.all if i != agent_id)
    after = [i for i in others if i > agent_id] + [i for i in others if i < agent_id]
    return [members.all[i] for i in after[:count]]


def watchers_of(members: Members, agent_id: str, count: int = NEIGHBOURS) -> list[str]:
    """The agents that watch `agent_id`: those it is among the neighbours of."""
    return sorted(
        m
        for m in members.all
        if m != agent_id and any(n.agent_id == agent_id for n in neighbours(members, m, count))
    )


class _Vote(StrEnum):
    """What the vote on a peer whose refusal was confirmed came to."""

    AGREED = "agreed"  # its watchers agree, and it is still registered: revoke it
    GONE = "gone"  # its registration went meanwhile (another voter revoked it)
    CLAIMED = "claimed"  # agreed, and another voter claimed the revoke: watch it go
    NOT_AGREED = "not_agreed"  # no agreement in time: watch it again


@dataclass(frozen=True)
class _Watched:
    """What a watch task is bound to: one registration (its lease) at one endpoint."""

    agent_id: str
    endpoint: str
    lease: int


class FastFailDetector(Lifecycle):
    """See the module docstring. `members` must be running before `start`."""

    def __init__(
        self,
        coord: Coordination,
        members: MembershipWatch,
        agent_id: str,
        *,
        neighbours: int = NEIGHBOURS,
        confirm_after_s: float = CONFIRM_AFTER_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        agreement: int = AGREEMENT,
        agree_wait_s: float = AGREE_WAIT_S,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.coord = coord
        self.members = members
        self.agent_id = agent_id
        self._count = neighbours
        self._confirm_s = confirm_after_s
        self._timeout_s = probe_timeout_s
        self._agreement = agreement
        self._agree_wait_s = agree_wait_s
        self._retry = (retry_initial_s, retry_max_s)
        self._tasks: dict[_Watched, asyncio.Task[None]] = {}
        self._marking: set[_Watched] = set()
        self._seen: set[_Watched] = set()
        self.metrics = FastFailMetrics(registry) if registry is not None else None
        self.marked_down: list[_Watched] = []  # what this detector revoked, in order

    @property
    def watched(self) -> list[str]:
        return sorted(w.agent_id for w in self._tasks)

    @property
    def seen_serving(self) -> list[str]:
        """The watched peers that answered SERVING (those a refusal can mark down)."""
        return sorted(w.agent_id for w in self._seen)

    async def _do_start(self) -> None:
        self.members.on_change(self._on_change)
        self._on_change(self.members.current)

    async def _do_stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        await cancel_and_wait(*tasks)

    def _on_change(self, current: Members) -> None:
        """Watch exactly the neighbours of this snapshot (called on the loop)."""
        if not self.running:
            return
        wanted = {
            _Watched(m.agent_id, m.endpoint, m.lease)
            for m in neighbours(current, self.agent_id, self._count)
            if m.lease  # a registration whose lease is unknown cannot be targeted
        }
        for gone in [w for w in self._tasks if w not in wanted]:
            # A watch marking its peer down sees the registration go before etcd's answer
            # to the revoke: it is left to finish (and log) rather than cancelled.
            if gone not in self._marking:
                self._tasks.pop(gone).cancel()
        for new in wanted - self._tasks.keys():
            task = asyncio.create_task(self._watch(new), name=f"fast-fail {new.agent_id}")
            self._tasks[new] = task
            task.add_done_callback(functools.partial(self._ended, new))
        if self.metrics is not None:
            self.metrics.watched.set(len(self._tasks))

    def _ended(self, peer: _Watched, task: asyncio.Task[None]) -> None:
        if self._tasks.get(peer) is task:
            del self._tasks[peer]
            if self.metrics is not None:
                self.metrics.watched.set(len(self._tasks))

    async def _watch(self, peer: _Watched) -> None:
        seen = False  # it answered SERVING on this registration
        delay = self._retry[0]

        def serving() -> None:
            nonlocal seen, delay
            if not seen:
                log.info("peer_watched", agent=peer.agent_id, endpoint=peer.endpoint)
                self._seen.add(peer)
            seen, delay = True, self._retry[0]

        channel = grpc.aio.insecure_channel(
            peer.endpoint,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        try:
            for _ in range(1_000_000):  # bounded; a live peer's stream never ends
                await _serving_until_broken(channel, serving)
                broke = time.monotonic()
                if seen and await self._check(peer, broke):
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])
        finally:
            self._seen.discard(peer)
            await channel.close()

    async def report(self, agent_id: str) -> bool:
        """A connection to `agent_id` broke: probe it as a broken watch would, and mark
        it down on a confirmed refusal. True once it is down (or gone)."""
        member = self.members.current.get(agent_id)
        if member is None or not member.lease:
            return member is None
        peer = _Watched(agent_id, member.endpoint, member.lease)
        return await self._check(peer, time.monotonic())

    async def _check(self, peer: _Watched, broke: float) -> bool:
        """After the watch on `peer` broke: True once it is marked down (or gone)."""
        first = await probe(peer.endpoint, self._timeout_s)
        if first is not Probe.REFUSED:
            self._count_outcome("answered" if first is Probe.ANSWERED else "unreachable")
            return False
        await asyncio.sleep(self._confirm_s)
        second = await probe(peer.endpoint, self._timeout_s)
        if second is not Probe.REFUSED:
            log.info(
                "peer_refusal_not_confirmed",
                agent=peer.agent_id,
                endpoint=peer.endpoint,
                second=str(second),
            )
            self._count_outcome("not_confirmed")
            return False
        self._marking.add(peer)
        try:
            verdict = await self._agreed(peer)
            if verdict in (_Vote.NOT_AGREED, _Vote.CLAIMED):
                return False
            if verdict is _Vote.GONE:
                self._count_outcome("superseded")
                log.info("peer_down_superseded", agent=peer.agent_id, lease=f"{peer.lease:x}")
                return True
            return await self.mark_down(
                peer.agent_id, peer.lease, endpoint=peer.endpoint, since=broke
            )
        finally:
            self._marking.discard(peer)

    async def _agreed(self, peer: _Watched) -> _Vote:
        """Vote `peer` down and wait (bounded) for the votes its other watchers owe.
        Only the votes of its watchers count (a `report` from another agent waits for
        theirs); GONE when its registration went meanwhile (another voter revoked it)."""
        current = self.members.current
        valid = set(watchers_of(current, peer.agent_id, self._count))
        needed = min(self._agreement, max(1, len(valid)))
        if needed <= 1:
            return _Vote.AGREED
        prefix = keys.down_votes(current.region, peer.agent_id, peer.lease)
        voters: set[str] = set()
        try:
            vote = await self.coord.grant(VOTE_TTL_S)
            if self.agent_id in valid:
                await self.coord.put(prefix + self.agent_id, b"", lease=vote.id)
            deadline = time.monotonic() + self._agree_wait_s
            for _ in range(int(self._agree_wait_s / VOTE_POLL_S) + 2):  # bounded by the wait
                votes, _ = await self.coord.get_prefix(prefix)
                voters = {kv.key.removeprefix(prefix) for kv in votes} & valid
                if len(voters) >= needed:
                    log.info("peer_down_agreed", agent=peer.agent_id, voters=sorted(voters))
                    found = await self.coord.get(keys.agent(current.region, peer.agent_id))
                    if found is None or found.lease != peer.lease:
                        return _Vote.GONE
                    # Both voters may see both votes: one claims the revoke (created
                    # once, on its vote's lease), so it is revoked and counted once.
                    claim = prefix.rstrip("/") + CLAIM_SUFFIX
                    won = await self.coord.txn(
                        [Compare(claim, Target.CREATE, Cmp.EQUAL, 0)],
                        [Put(claim, self.agent_id.encode(), lease=vote.id)],
                    )
                    return _Vote.AGREED if won.succeeded else _Vote.CLAIMED
                now = self.members.current.get(peer.agent_id)
                if now is None or now.lease != peer.lease:
                    return _Vote.GONE
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(VOTE_POLL_S)
        except MeridianError as exc:
            log.warning("peer_down_vote_failed", agent=peer.agent_id, error=str(exc))
            self._count_outcome("failed")
            return _Vote.NOT_AGREED
        self._count_outcome("not_agreed")
        log.info(
            "peer_down_not_agreed",
            agent=peer.agent_id,
            voters=sorted(voters),
            needed=needed,
            action="watching it again; its lease lapses on its own otherwise",
        )
        return _Vote.NOT_AGREED

    async def mark_down(
        self, agent_id: str, lease: int, *, endpoint: str = "", since: float | None = None
    ) -> bool:
        """Remove the registration of `agent_id` that is on `lease`, and only that one:
        True when it is gone (revoked here, or already gone or replaced)."""
        current = self.members.current.get(agent_id)
        if current is None or current.lease != lease:
            self._count_outcome("superseded")
            log.info("peer_down_superseded", agent=agent_id, lease=f"{lease:x}")
            return True
        try:
            await self.coord.revoke(lease)
        except MeridianError as exc:
            self._count_outcome("failed")
            log.warning(
                "peer_mark_down_failed",
                agent=agent_id,
                lease=f"{lease:x}",
                error=str(exc),
                action="probing again; its lease lapses on its own otherwise",
            )
            return False
        self.marked_down.append(_Watched(agent_id, endpoint, lease))
        self._count_outcome("marked_down")
        log.warning(
            "peer_marked_down",
            agent=agent_id,
            endpoint=endpoint,
            lease=f"{lease:x}",
            reason="connection refused, confirmed",
            after_s=round(time.monotonic() - since, 3) if since is not None else None,
        )
        return True

    def _count_outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.checks.labels(outcome=outcome).inc()


async def _serving_until_broken(channel: grpc.aio.Channel, serving: Callable[[], None]) -> None:
    """Hold a health watch on `channel` until it ends, calling `serving()` at each SERVING."""
    stub = health_pb2_grpc.HealthStub(channel)
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    try:
        async for answer in call:
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                serving()
    except grpc.aio.AioRpcError:
        pass  # the stream broke: the caller finds out why
    finally:
        call.cancel()
