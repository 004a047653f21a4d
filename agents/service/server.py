"""The agent's gRPC server: one `grpc.aio` server carrying an `AgentService`.

Message limits are sized for the API's bulk framing (1 MiB chunks plus a header),
so a bigger message is refused by grpc itself with RESOURCE_EXHAUSTED before any
of it is handled. Keepalive pings find a peer that vanished (a killed agent, a
cut WAN link) within about 30 s instead of the kernel's retransmission time, so a
stuck transfer fails and can resume elsewhere.

The server also carries the standard health service (grpc.health.v1), which the
Helm chart's gRPC probes ask with the empty service name: SERVING for "" and
`meridian.v1.Agent` once the server has started, NOT_SERVING as soon as a stop
begins (readiness drops while calls drain).

`stop_server(server, grace_s)` lets calls in flight finish for `grace_s` seconds
and then cancels the rest; a cancelled write leaves nothing half-committed (the
store commits atomically or not at all, and drops the temporary file).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agents.service.servicer import AgentService
from agents.store import CHUNK_BYTES
from controlplane.errors import ConfigError
from controlplane.logs import get_logger
from meridian.v1 import agent_pb2, agent_pb2_grpc

log = get_logger("meridian.agent.server")

# A 1 MiB chunk plus its framing and a header; well under anything that is not a chunk.
MAX_MESSAGE_BYTES = CHUNK_BYTES + 64 * 1024

OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Ping an idle connection every 20 s, give up on it 10 s later.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Let clients ping as often as every 10 s (their keepalive) without a GOAWAY.
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


# The names the health service answers for: "" (the whole server, what a Kubernetes
# gRPC probe without `service` asks) and the API's full service name.
HEALTH_SERVICES = (health.OVERALL_HEALTH, agent_pb2.DESCRIPTOR.services_by_name["Agent"].full_name)
# The health servicer of each running server (by id: grpc.aio.Server takes no attributes).
_HEALTH: dict[int, health.aio.HealthServicer] = {}


async def start_server(service: AgentService, listen: str) -> tuple[grpc.aio.Server, int]:
    """Serve `service` on `listen` (`host:port`; port 0 picks a free one). Returns the
    started server and the port it listens on; `ConfigError` when it cannot bind."""
    server = grpc.aio.server(options=OPTIONS)
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    _HEALTH[id(server)] = checks
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ConfigError(f"the agent cannot listen on {listen}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"the agent cannot listen on {listen} (in use, or not an address)")
    await server.start()
    for name in HEALTH_SERVICES:
        await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("agent_serving", listen=listen, port=port, region=service.region)
    return server, port


async def stop_server(server: grpc.aio.Server, grace_s: float | None = 5.0) -> None:
    """Stop accepting calls, let those in flight end within `grace_s` (None: cancel them
    at once), then cancel the rest. Health checks answer NOT_SERVING from the start."""
    checks = _HEALTH.pop(id(server), None)
    if checks is not None:
        await checks.enter_graceful_shutdown()
    await server.stop(grace_s)
    log.info("agent_stopped", grace_s=grace_s)
