"""The node agent's gRPC API (`meridian.v1.Agent`): the servicer and its server.

from agents.service import AgentService, start_server, stop_server
"""

from agents.service.server import MAX_MESSAGE_BYTES, start_server, stop_server
from agents.service.servicer import AgentService, CommittedWrite, Replication, Transfers

__all__ = [
    "MAX_MESSAGE_BYTES",
    "AgentService",
    "CommittedWrite",
    "Replication",
    "Transfers",
    "start_server",
    "stop_server",
]
