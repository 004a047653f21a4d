"""The error ↔ status mapping of the agent API, through a real grpc.aio server."""

from __future__ import annotations

import grpc
import pytest

from agents.errors import ResidencyError
from agents.rpc.status import abort, code_of, from_rpc_error
from agents.store.errors import DigestMismatchError, MissingContentError, TooLargeError
from controlplane.coordination.protocols.fencing import StaleEpochError
from controlplane.domain.errors import ClockSkewError
from controlplane.errors import (
    HandingOverError,
    InvalidInputError,
    MeridianError,
    UnavailableError,
)
from meridian.v1 import agent_pb2, agent_pb2_grpc

CASES: list[tuple[MeridianError, grpc.StatusCode]] = [
    (InvalidInputError("key '../x' escapes the root"), grpc.StatusCode.INVALID_ARGUMENT),
    (ResidencyError("us-east is outside the EU residency"), grpc.StatusCode.PERMISSION_DENIED),
    (StaleEpochError("epoch 3 is older than 4"), grpc.StatusCode.FAILED_PRECONDITION),
    (HandingOverError("ckpt is handing over"), grpc.StatusCode.UNAVAILABLE),
    (UnavailableError("etcd is unreachable"), grpc.StatusCode.UNAVAILABLE),
    (DigestMismatchError("digest differs"), grpc.StatusCode.DATA_LOSS),
    (TooLargeError("over 1 MiB"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (MissingContentError("bytes lost"), grpc.StatusCode.UNAVAILABLE),
    # Not a stale epoch, though it shares the code: the replicator dead-letters it as skew.
    (
        ClockSkewError("2 s ahead of this clock", ahead_ms=2000, max_skew_ms=1000),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda c: type(c).__name__)
def test_each_error_has_the_code_of_the_spec(exc: MeridianError, code: grpc.StatusCode) -> None:
    assert code_of(exc) == code


class Refuser(agent_pb2_grpc.AgentServicer):
    """Test scaffolding: answers Health with the error it was given."""

    def __init__(self) -> None:
        self.exc: MeridianError = UnavailableError("unset")

    async def Health(  # noqa: N802 - the generated name
        self, request: agent_pb2.HealthRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> agent_pb2.HealthResponse:
        await abort(context, self.exc)


async def test_a_client_re_raises_the_class_and_message_the_server_aborted_with() -> None:
    servicer = Refuser()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for exc, code in CASES:
                servicer.exc = exc
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Health(agent_pb2.HealthRequest(), timeout=5)
                assert caught.value.code() == code
                again = from_rpc_error(caught.value, peer=f"127.0.0.1:{port}")
                assert type(again) is type(exc)
                assert str(again) == str(exc)
                assert again.retriable == exc.retriable
    finally:
        await server.stop(None)


async def test_an_unreachable_peer_is_a_retriable_error_naming_it() -> None:
    async with grpc.aio.insecure_channel("127.0.0.1:9") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Health(agent_pb2.HealthRequest(), timeout=2)
    err = from_rpc_error(caught.value, peer="127.0.0.1:9")
    assert isinstance(err, UnavailableError)
    assert err.retriable
    assert "127.0.0.1:9" in str(err)
