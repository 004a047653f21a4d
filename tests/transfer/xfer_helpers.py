"""Helpers of the transfer tests: content with known deltas, Fetch calls, journal reads."""

from __future__ import annotations

import random
from typing import Any

import grpc

from agents.store import ObjectStore
from agents.transfer.pull import CHANNEL_OPTIONS
from controlplane.domain.version import Version
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc


def content(size: int, seed: int = 1) -> bytes:
    """Bytes that neither compress nor repeat."""
    return random.Random(seed).randbytes(size)


def rewrite(data: bytes, fraction: float, seed: int = 2, region: int = 64 << 10) -> bytes:
    """`data` with about `fraction` of it rewritten, in scattered `region`-byte runs."""
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(max(1, int(len(data) * fraction / region))):
        at = rng.randrange(0, max(1, len(data) - region))
        out[at : at + region] = rng.randbytes(region)
    return bytes(out)


async def fetch(
    address: str,
    dataset: str,
    key: str,
    version: Version,
    sources: list[tuple[str, str]],
    timeout_s: float = 60.0,
    set_id: str | None = None,
) -> agent_pb2.FetchResponse:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        request = agent_pb2.FetchRequest(
            dataset=dataset,
            key=key,
            version=version_to_wire(version),
            sources=[agent_pb2.FetchSource(region=r, address=a) for r, a in sources],
            origin_region=version.hlc.region,
        )
        if set_id is not None:
            request.set = set_id
        response: agent_pb2.FetchResponse = await stub.Fetch(request, timeout=timeout_s)
        return response


def transfers(store: ObjectStore) -> list[dict[str, Any]]:
    """The transfer records in a store's journal, oldest first (with the HLC of the
    version each names, as `journal_hlc`)."""
    return [
        {**e.data, "journal_hlc": e.hlc}
        for e in store.journal_pending(10_000)
        if e.kind == "transfer"
    ]
