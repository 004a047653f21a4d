"""`AgentPort` over the agent's gRPC API (proto/meridian/v1/agent.proto).

- an inline put or a delete: `Replicate` with epoch 0 (the standard class has no
  epoch), the header then the inline bytes in 1 MiB chunks (none for a delete);
  the agent applies by LWW and answers the newest version it holds after its
  commit, from which the outcome is read (that very version: held; a newer one:
  the event was older; the same HLC with another digest: a collision);
- a large put: `Fetch` with the sources nearest first; the agent pulls it with
  `Sync` and answers the outcome itself;
- `head`: `Stat` of the newest version (NOT_FOUND: none).

Every call has a deadline. Failures come back as Meridian errors through
`agents.rpc.status.from_rpc_error` (a refused residency as `ResidencyError`, a
stale epoch as `StaleEpochError`, an unreachable agent as a retriable
`UnavailableError`).

Until `agents.client.AgentClient` lands this adapter speaks to the generated stub
itself; it is the one module to switch then.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from agents.rpc.status import from_rpc_error
from controlplane.domain.events import ChangeEvent
from controlplane.domain.version import Version
from controlplane.errors import MeridianError, NotFoundError
from controlplane.lifecycle import Lifecycle
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc
from replicator.ports import ApplyOutcome, ApplyResult, Source

CHUNK_BYTES = 1024 * 1024
MAX_MESSAGE_BYTES = CHUNK_BYTES + 64 * 1024

_OUTCOMES = {
    agent_pb2.APPLY_OUTCOME_APPLIED: ApplyOutcome.APPLIED,
    agent_pb2.APPLY_OUTCOME_SAME: ApplyOutcome.SAME,
    agent_pb2.APPLY_OUTCOME_OLDER: ApplyOutcome.OLDER,
    agent_pb2.APPLY_OUTCOME_COLLISION: ApplyOutcome.COLLISION,
}


def outcome_of(event: ChangeEvent, held: Version | None) -> ApplyOutcome:
    """What an apply did, from the version held after it (Replicate answers only that)."""
    if held is None or held.hlc < event.version.hlc:
        # The agent answered an older version than the one it committed: not LWW.
        raise MeridianError(
            f"the agent holds {held.hlc if held else 'nothing'} of {event.dataset}/{event.key} "
            f"after applying {event.version.hlc}"
        )
    if held.hlc > event.version.hlc:
        return ApplyOutcome.OLDER
    return ApplyOutcome.APPLIED if held == event.version else ApplyOutcome.COLLISION


class GrpcAgent(Lifecycle):
    def __init__(self, address: str, *, timeout_s: float = 30.0, fetch_timeout_s: float = 600.0):
        self.address = address
        self._timeout_s = timeout_s
        self._fetch_timeout_s = fetch_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: agent_pb2_grpc.AgentAsyncStub | None = None

    async def _do_start(self) -> None:
        self._channel = grpc.aio.insecure_channel(
            self.address,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = agent_pb2_grpc.AgentStub(self._channel)

    async def _do_stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    @property
    def stub(self) -> agent_pb2_grpc.AgentAsyncStub:
        if self._stub is None:
            raise RuntimeError("GrpcAgent is not started")
        return self._stub

    async def _replicate(self, event: ChangeEvent) -> ApplyResult:
        header = agent_pb2.ReplicateHeader(
            dataset=event.dataset,
            key=event.key,
            version=version_to_wire(event.version),
            epoch=0,
            origin_region=event.origin_region,
            policy_revision=event.policy_revision,
        )
        if event.set is not None:
            header.set = event.set

        async def frames() -> AsyncIterator[agent_pb2.ReplicateRequest]:
            yield agent_pb2.ReplicateRequest(header=header)
            data = event.inline or b""
            for start in range(0, len(data), CHUNK_BYTES):
                yield agent_pb2.ReplicateRequest(chunk=data[start : start + CHUNK_BYTES])

        try:
            reply = await self.stub.Replicate(frames(), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, self.address) from err
        held = version_from_wire(reply.version, "ReplicateResponse.version")
        return ApplyResult(outcome_of(event, held), held, logical_bytes=event.version.size)

    async def apply_inline(self, event: ChangeEvent) -> ApplyResult:
        return await self._replicate(event)

    async def delete(self, event: ChangeEvent) -> ApplyResult:
        return await self._replicate(event)

    async def fetch(self, event: ChangeEvent, sources: Sequence[Source]) -> ApplyResult:
        request = agent_pb2.FetchRequest(
            dataset=event.dataset,
            key=event.key,
            version=version_to_wire(event.version),
            sources=[agent_pb2.FetchSource(region=s.region, address=s.address) for s in sources],
            origin_region=event.origin_region,
            policy_revision=event.policy_revision,
        )
        if event.set is not None:
            request.set = event.set
        try:
            reply = await self.stub.Fetch(request, timeout=self._fetch_timeout_s)
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, self.address) from err
        outcome = _OUTCOMES.get(reply.outcome)
        if outcome is None:
            raise MeridianError(f"the agent at {self.address} answered Fetch with no outcome")
        held = (
            version_from_wire(reply.held, "FetchResponse.held") if reply.HasField("held") else None
        )
        return ApplyResult(
            outcome,
            held,
            source_region=reply.source_region or None,
            logical_bytes=reply.logical_bytes,
            wire_bytes=reply.wire_bytes,
        )

    async def head(self, dataset: str, key: str) -> Version | None:
        try:
            reply = await self.stub.Stat(
                agent_pb2.StatRequest(dataset=dataset, key=key), timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as err:
            error = from_rpc_error(err, self.address)
            if isinstance(error, NotFoundError):
                return None
            raise error from err
        return version_from_wire(reply.object.version, "StatResponse.object.version")
