"""`AgentPort` over the region's agent, through the client library `agents.client.AgentClient`.

- inline puts and deletes: `ReplicateMany` (one event or a batch; the agent's
  verdict per item), or, for a set member or an agent without that call,
- an inline put or a delete: `Replicate` with epoch 0 (the standard class has no
  epoch), the inline bytes in 1 MiB chunks (none for a delete); the agent applies
  by LWW and answers the newest version it holds after its commit, from which the
  outcome is read (that very version: held; a newer one: the event was older; the
  same HLC with another digest: a collision);
- a large put: `Fetch` with the sources nearest first; the agent pulls it with
  `Sync` and answers the outcome itself;
- `head`: `Stat` of the newest version (NOT_FOUND: none);
- a version set (`SetPort`): `ReplicateSet` at the event's epoch (0: a standard set),
  the call a critical owner pushes its sets with; the agent fences it (residency) and
  applies it by LWW on the set's HLC, and answers whether the set is complete there.

Failures come back as Meridian errors (`from_rpc_error` in the client): a refused
residency as `ResidencyError`, a stale epoch as `StaleEpochError`, an unreachable
agent as a retriable `UnavailableError`. `route(region, address)` rewrites where
another region's agent is reached (`Settings.agent_address`: the demo and the
chaos suite route every link through a proxy of its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc.aio

from agents.client import AgentClient, FetchSource, ReplicateItem
from agents.rpc.status import from_rpc_error
from controlplane.domain.events import ChangeEvent, SetEvent
from controlplane.domain.version import Verdict, Version
from controlplane.errors import MeridianError, NotFoundError, UnavailableError
from controlplane.lifecycle import Lifecycle
from controlplane.logs import get_logger
from meridian.convert import version_set_to_wire
from meridian.v1 import agent_pb2
from replicator.ports import ApplyOutcome, ApplyResult, SetApplyResult, Source

log = get_logger("meridian.replicator")

_OUTCOMES = {
    Verdict.APPLY: ApplyOutcome.APPLIED,
    Verdict.SAME: ApplyOutcome.SAME,
    Verdict.OLDER: ApplyOutcome.OLDER,
    Verdict.COLLISION: ApplyOutcome.COLLISION,
}
_SET_OUTCOMES = {
    agent_pb2.APPLY_OUTCOME_APPLIED: ApplyOutcome.APPLIED,
    agent_pb2.APPLY_OUTCOME_SAME: ApplyOutcome.SAME,
    agent_pb2.APPLY_OUTCOME_OLDER: ApplyOutcome.OLDER,
    agent_pb2.APPLY_OUTCOME_COLLISION: ApplyOutcome.COLLISION,
}


def outcome_of(event: ChangeEvent, held: Version) -> ApplyOutcome:
    """What an apply did, from the version held after it (Replicate answers only that)."""
    if held.hlc < event.version.hlc:
        raise MeridianError(
            f"the agent holds {held.hlc} of {event.dataset}/{event.key} after applying "
            f"{event.version.hlc}: it did not apply by LWW"
        )
    if held.hlc > event.version.hlc:
        return ApplyOutcome.OLDER
    return ApplyOutcome.APPLIED if held == event.version else ApplyOutcome.COLLISION


class BatchUnsupportedError(MeridianError):
    """The agent does not serve ReplicateMany (an agent older than the call)."""


# How long a retired agent's channel stays open for the calls still on it: a few of
# their deadlines (a large Fetch may outlast one), yet one idle channel per agent
# replaced does not pile up for as long as the replicator runs.
RETIRED_CLOSE_S = 300.0


def _direct(_region: str, address: str) -> str:
    return address


class GrpcAgent(Lifecycle):
    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 30.0,
        route: Callable[[str, str], str] = _direct,
    ) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._client = AgentClient(address, timeout_s=timeout_s)
        self._route = route
        self._batches = True  # until the agent says it has no ReplicateMany
        # Clients of earlier agents (`retarget`), with when each was retired: calls still
        # on them end by themselves, and `close_retired` closes them afterwards.
        self._retired: list[tuple[float, AgentClient]] = []

    def routed(self, region: str, endpoint: str) -> str:
        """Where `region`'s agent at `endpoint` is dialled (MERIDIAN_AGENT_ROUTES)."""
        return self._route(region, endpoint)

    def retarget(self, address: str) -> None:
        """Apply through the agent at `address` from the next call on (its region's
        agent moved: replicator/agent_follow.py). Calls in flight finish, or fail and
        are retried, on the old one; its channel is closed by `close_retired`, or at
        stop."""
        if address == self.address:
            return
        client = AgentClient(address, timeout_s=self._timeout_s)  # a bad address raises here
        self._retired.append((time.monotonic(), self._client))
        self._client = client
        self.address = address
        self._batches = True  # the new agent is asked again

    async def close_retired(self, after_s: float | None = None) -> int:
        """Close the channels of the agents retired at least `after_s` ago (default
        RETIRED_CLOSE_S; a call still on one then fails, and the applier retries it on
        the agent in use); how many."""
        wait_s = RETIRED_CLOSE_S if after_s is None else after_s
        now = time.monotonic()
        closed = 0
        for entry in [e for e in self._retired if now - e[0] >= wait_s]:
            try:
                await entry[1].close()
            except Exception as exc:  # noqa: BLE001 - one channel's close stops no other's
                log.warning("agent_channel_close_failed", agent=entry[1].address, error=repr(exc))
            # Forgotten once closed (or failed to): one still open when this is cancelled
            # stays for the next pass, or for stop.
            self._retired.remove(entry)
            closed += 1
        return closed

    async def region(self, *, timeout_s: float | None = None) -> str:
        """The region the agent serves (its Health answer)."""
        return (await self._client.health(timeout_s=timeout_s)).region

    async def _do_start(self) -> None:
        return None

    async def _do_stop(self) -> None:
        for _, client in self._retired:
            await client.close()
        await self._client.close()

    async def _replicate(self, event: ChangeEvent) -> ApplyResult:
        if event.set is None and self._batches:
            # A batch of one: the same commit, and the agent's own verdict (a replay is
            # SAME), which Replicate's answer (the version held) cannot tell from APPLIED.
            try:
                (answer,) = await self.apply_many([event])
            except BatchUnsupportedError:
                pass
            else:
                if isinstance(answer, Exception):
                    raise answer
                return answer
        held = await self._client.replicate(
            event.dataset,
            event.key,
            event.version,
            event.inline if not event.version.is_tombstone else None,
            epoch=0,
            origin_region=event.origin_region,
            set_id=event.set,
            policy_revision=event.policy_revision,
        )
        return ApplyResult(outcome_of(event, held), held, logical_bytes=event.version.size)

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        return await self._replicate(event)

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        return await self._replicate(event)

    async def apply_many(self, events: Sequence[ChangeEvent]) -> list[ApplyResult | Exception]:
        if not self._batches:
            raise BatchUnsupportedError(f"the agent at {self.address} has no ReplicateMany")
        client = self._client
        try:
            answers = await client.replicate_many(
                [
                    ReplicateItem(
                        e.dataset,
                        e.key,
                        e.version,
                        None if e.version.is_tombstone else (e.inline or b""),
                        e.origin_region,
                        e.policy_revision,
                    )
                    for e in events
                ]
            )
        except UnavailableError as exc:
            if "(UNIMPLEMENTED)" not in str(exc):
                raise
            # An agent older than the call: one by one from now on (Replicate), unless
            # the answer came from an agent since replaced (`retarget`).
            if client is self._client:
                self._batches = False
            raise BatchUnsupportedError(str(exc)) from exc
        out: list[ApplyResult | Exception] = []
        for e, answer in zip(events, answers, strict=True):
            if isinstance(answer, Exception):
                out.append(answer)
            else:
                outcome = _OUTCOMES[answer.outcome]
                out.append(ApplyResult(outcome, answer.held, logical_bytes=e.version.size))
        return out

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        result = await self._client.fetch(
            event.dataset,
            event.key,
            event.version,
            [FetchSource(s.region, self._route(s.region, s.address)) for s in sources],
            origin_region=event.origin_region,
            set_id=event.set,
            policy_revision=event.policy_revision,
        )
        return ApplyResult(
            _OUTCOMES[result.outcome],
            result.held,
            source_region=result.source_region or None,
            logical_bytes=result.logical_bytes,
            wire_bytes=result.wire_bytes,
        )

    async def apply_set(self, event: SetEvent) -> SetApplyResult:
        request = agent_pb2.ReplicateSetRequest(
            sets=[version_set_to_wire(event.version_set)],
            epoch=event.epoch,
            origin_region=event.origin_region,
            policy_revision=event.policy_revision,
        )
        try:
            resp = await self._client.stub.ReplicateSet(request, timeout=self._client.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, self.address) from None
        if len(resp.sets) != 1 or resp.sets[0].id != event.set_id:
            raise UnavailableError(
                f"the agent at {self.address} answered {len(resp.sets)} sets for set "
                f"{event.set_id} of {event.dataset}"
            )
        got = resp.sets[0]
        outcome = _SET_OUTCOMES.get(got.outcome)
        if outcome is None:
            raise UnavailableError(
                f"the agent at {self.address} answered an unknown outcome {got.outcome} for "
                f"set {event.set_id} of {event.dataset}"
            )
        return SetApplyResult(outcome, got.complete, tuple(got.missing))

    async def head(self, dataset: str, key: str) -> Version | None:
        try:
            info = await self._client.stat(dataset, key)
        except NotFoundError:
            return None
        return info.version
