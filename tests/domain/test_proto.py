"""The generated protobuf code: fresh (made from the current .proto files), typed, and
with the calls and fields spec/dataplane.md names; the Agent service works over a
real gRPC channel."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from google.protobuf import __version__ as protobuf_version
from google.protobuf.descriptor import FieldDescriptor

from controlplane.domain.hlc import HLC
from controlplane.domain.version import ContentHasher, Version
from meridian.convert import version_from_wire, version_to_wire
from meridian.v1 import _generated, agent_pb2, agent_pb2_grpc, change_event_pb2

ROOT = Path(__file__).resolve().parents[2]


def load_protogen() -> object:
    spec = importlib.util.spec_from_file_location("protogen", ROOT / "scripts" / "protogen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_made_from_the_current_proto_files() -> None:
    protogen = load_protogen()
    current = protogen.sources_digest()  # type: ignore[attr-defined]
    assert current == _generated.SOURCES_SHA256, (
        "meridian/v1 is stale: proto/meridian/v1 changed since it was generated; "
        "run `pip install -e .` or `python scripts/protogen.py`"
    )


def test_the_stale_check_sees_an_edited_proto(tmp_path: Path) -> None:
    protogen = load_protogen()
    copy = tmp_path / "meridian" / "v1"
    copy.mkdir(parents=True)
    for path in (ROOT / "proto" / "meridian" / "v1").glob("*.proto"):
        (copy / path.name).write_bytes(path.read_bytes())
    same = protogen.sources_digest(tmp_path)  # type: ignore[attr-defined]
    assert same == protogen.sources_digest()  # type: ignore[attr-defined]
    with (copy / "types.proto").open("a") as f:
        f.write("// an edit\n")
    assert protogen.sources_digest(tmp_path) != same  # type: ignore[attr-defined]


def test_protobuf_runtime_is_at_least_the_generated_code_version() -> None:
    gencode = (ROOT / "meridian" / "v1" / "types_pb2.py").read_text()
    line = next(x for x in gencode.splitlines() if x.startswith("# Protobuf Python Version:"))
    made = tuple(int(p) for p in line.split(":")[1].strip().split("."))
    runtime = tuple(int(p) for p in protobuf_version.split(".")[:3])
    assert runtime[0] == made[0] and runtime >= made


def test_stubs_are_typed_for_mypy() -> None:
    folder = ROOT / "meridian" / "v1"
    for name in ("types_pb2", "change_event_pb2", "agent_pb2", "agent_pb2_grpc"):
        assert (folder / f"{name}.pyi").is_file(), name
    assert (ROOT / "meridian" / "py.typed").is_file()


# (call, client streams, server streams), as spec/dataplane.md lists them.
CALLS = [
    ("Put", True, False),
    # An addition to the spec table (issue 13): a whole object of at most 64 KiB in one
    # message, what Put does without a stream.
    ("PutSmall", False, False),
    ("Get", False, True),
    ("Stat", False, False),
    ("List", False, False),
    ("Delete", False, False),
    ("CommitSet", False, False),
    ("Signature", False, True),
    ("Sync", True, True),
    ("Replicate", True, False),
    ("Health", False, False),
    # An addition to the spec table: the replicator asks its agent to fetch (issue 12).
    ("Fetch", False, False),
    # Additions of issue 10: a set as one agent shows it (the client library), and
    # bundles of small objects in one stream (transfers).
    ("GetSet", False, False),
    ("SyncBundle", False, True),
    ("FetchMany", False, False),
    ("ReplicateSet", False, False),
    ("ReplicateMany", False, False),
    # The takeover pass's call (lead, issue 13): a deposed owner's unacked write undone.
    ("Rewind", False, False),
    # Critical pushes batched by their owner (crit, issue 13).
    ("ReplicatePushes", False, False),
    # A region's copies of a dataset no longer placed there (`meridian dataset evict`).
    ("Evict", False, False),
]


def test_agent_service_has_the_calls_of_the_spec() -> None:
    service = agent_pb2.DESCRIPTOR.services_by_name["Agent"]
    assert service.full_name == "meridian.v1.Agent"
    found = [(m.name, m.client_streaming, m.server_streaming) for m in service.methods]
    assert found == CALLS


def test_change_event_has_every_field_of_the_spec() -> None:
    desc = change_event_pb2.ChangeEvent.DESCRIPTOR
    assert desc.full_name == "meridian.v1.ChangeEvent"
    fields = {f.name: f for f in desc.fields}
    assert set(fields) == {
        "schema",
        "event_id",
        "dataset",
        "key",
        "version",
        "origin_region",
        "epoch",
        "policy_revision",
        "set",
        "inline",
        "origin_agent",
        # Schema 2, a version set's event (added at the end, field 12).
        "version_set",
    }
    assert fields["schema"].number == 1  # first, so any reader finds it
    assert fields["version_set"].number == 12
    assert fields["version_set"].message_type.full_name == "meridian.v1.VersionSet"
    version = {f.name for f in fields["version"].message_type.fields}
    assert version == {"hlc", "op", "size", "digest"}
    assert fields["inline"].containing_oneof is fields["origin_agent"].containing_oneof
    assert fields["set"].has_presence  # optional
    assert fields["inline"].type == FieldDescriptor.TYPE_BYTES


class TinyAgent(agent_pb2_grpc.AgentServicer):
    """Test scaffolding: just enough of an agent to prove the generated service."""

    async def Health(  # noqa: N802 - the generated name
        self, request: agent_pb2.HealthRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> agent_pb2.HealthResponse:
        return agent_pb2.HealthResponse(live=True, region="eu-west", agent_id="a1")

    async def Put(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.PutRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> agent_pb2.PutResponse:
        hasher, size, header = ContentHasher(), 0, None
        async for frame in request_iterator:
            if frame.WhichOneof("frame") == "header":
                header = frame.header
            else:
                hasher.update(frame.chunk)
                size += len(frame.chunk)
        if header is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PutRequest.header is missing")
        version = Version.put(HLC(1764579123456, 0, "eu-west"), size, hasher.digest())
        return agent_pb2.PutResponse(version=version_to_wire(version))


async def test_agent_service_over_a_real_channel() -> None:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(TinyAgent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            health = await stub.Health(agent_pb2.HealthRequest(), timeout=10)
            assert health.live and health.region == "eu-west"

            async def frames() -> AsyncIterator[agent_pb2.PutRequest]:
                yield agent_pb2.PutRequest(
                    header=agent_pb2.PutHeader(dataset="corpus/web", key="a", epoch=3)
                )
                for _ in range(3):
                    yield agent_pb2.PutRequest(chunk=b"x" * 1000)

            reply = await stub.Put(frames(), timeout=10)
            version = version_from_wire(reply.version, "PutResponse.version")
            assert version.size == 3000 and version.digest is not None

            async def header_less() -> AsyncIterator[agent_pb2.PutRequest]:
                yield agent_pb2.PutRequest(chunk=b"x")

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Put(header_less(), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(grace=None)


def test_domain_benchmark_runs_and_prints_every_measure() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "domain_bench.py"), "--seconds", "0.01"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    names = [line[:30].strip() for line in out[:6]]
    assert names[0] == "HybridClock.now" and names[-1] == "decode ChangeEvent (1 KiB)"
    assert all(float(line[30:].split()[0].replace(",", "")) > 0 for line in out[:6])
