"""gRPC stubs to the other agents of this region, one channel per endpoint, and the
metadata that marks a call as already routed (one hop, never two)."""

from __future__ import annotations

import grpc

from agents.service.server import MAX_MESSAGE_BYTES
from meridian.v1 import agent_pb2_grpc

# A call carrying this key was sent by another agent of the region: it is served here,
# whatever this agent thinks the placement is (views differ for a moment while a
# registration change travels), so a request never bounces between agents.
ROUTED_KEY = "x-meridian-routed-by"

Context = grpc.aio.ServicerContext[object, object]


def routed_by(context: Context) -> str | None:
    """The agent id that routed this call here, or None for a client's call."""
    for key, value in context.invocation_metadata() or ():
        if key == ROUTED_KEY:
            return value if isinstance(value, str) else bytes(value).decode()
    return None


class PeerStubs:
    """Channels to peers, opened on first use and kept (a region has tens of agents);
    `close` ends them all. `route` maps a registered endpoint to the address dialled."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, agent_pb2_grpc.AgentAsyncStub] = {}

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ROUTED_KEY, self.agent_id),)

    def stub(self, endpoint: str) -> agent_pb2_grpc.AgentAsyncStub:
        found = self._stubs.get(endpoint)
        if found is None:
            channel = grpc.aio.insecure_channel(
                endpoint,
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    # A dead peer must fail the next call fast, not after a long backoff.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._channels[endpoint] = channel
            found = self._stubs[endpoint] = agent_pb2_grpc.AgentStub(channel)
        return found

    async def forget(self, endpoint: str) -> None:
        """Close the channel to an agent that left."""
        channel = self._channels.pop(endpoint, None)
        self._stubs.pop(endpoint, None)
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            await channel.close()
