"""The in-region copies of a committed write: the other owners pull it from the agent
that committed it (`Fetch` with this agent as the one source: `Sync`, with a delta
where the owner holds a basis), and the write is acked only once `r` agents hold it.

An owner that cannot be reached (killed, its lease not lapsed yet) is passed over for
the next agent in the object's placement order, as Dynamo's sloppy quorum does with
a hinted hand-off: the write still has `r` copies when it is acked, and the rebalance
moves the stand-in's copy to the owner once the membership settles.
"""

from __future__ import annotations

import grpc

from agents.placement.members import Member
from agents.routing.peers import PeerStubs
from agents.rpc.status import from_rpc_error
from controlplane.domain.version import Version
from controlplane.errors import UnavailableError
from controlplane.logs import get_logger
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2

log = get_logger("meridian.agent.routing")

# Per copy: a fixed allowance plus the bytes at a conservative in-region rate.
_COPY_BASE_S = 10.0
_COPY_BYTES_PER_S = 20 * 1024 * 1024


def copy_timeout_s(size: int) -> float:
    return _COPY_BASE_S + size / _COPY_BYTES_PER_S


async def fetch_to(
    peers: PeerStubs,
    target: Member,
    dataset: str,
    key: str,
    version: Version,
    *,
    region: str,
    source: str,
    set_id: str | None = None,
) -> agent_pb2.FetchResponse:
    """Ask `target` to pull `version` from the agent at `source` (this one) and commit it
    by LWW; returns its answer, raises the Meridian error it failed with."""
    request = agent_pb2.FetchRequest(
        dataset=dataset,
        key=key,
        version=version_to_wire(version),
        sources=[agent_pb2.FetchSource(region=region, address=source)],
        origin_region=version.hlc.region,
    )
    if set_id is not None:
        request.set = set_id
    try:
        response: agent_pb2.FetchResponse = await peers.stub(target.endpoint).Fetch(
            request, timeout=copy_timeout_s(version.size), metadata=peers.metadata
        )
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, target.endpoint) from err
    return response


async def fetch_many_to(
    peers: PeerStubs,
    target: Member,
    items: list[tuple[str, str, Version]],
    *,
    region: str,
    source: str,
) -> agent_pb2.FetchManyResponse:
    """Ask `target` to pull several versions from `source` in one call (`FetchMany`:
    small objects travel in bundles, committed with one sync), one result or error
    per item, in order."""
    request = agent_pb2.FetchManyRequest(
        items=[
            agent_pb2.FetchRequest(
                dataset=dataset,
                key=key,
                version=version_to_wire(version),
                sources=[agent_pb2.FetchSource(region=region, address=source)],
                origin_region=version.hlc.region,
            )
            for dataset, key, version in items
        ]
    )
    timeout = _COPY_BASE_S + sum(v.size for _, _, v in items) / _COPY_BYTES_PER_S
    try:
        response: agent_pb2.FetchManyResponse = await peers.stub(target.endpoint).FetchMany(
            request, timeout=timeout, metadata=peers.metadata
        )
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, target.endpoint) from err
    return response


async def place_copies(
    peers: PeerStubs,
    ranked: list[Member],
    r: int,
    self_id: str,
    dataset: str,
    key: str,
    version: Version,
    *,
    region: str,
    source: str,
) -> list[str]:
    """Make `r` agents (this one counted, being the committer, when it serves) hold
    `version`, taking the agents of `ranked` (the object's serving agents in placement
    order) in turn. Returns the ids holding it; `UnavailableError` when fewer than `r`
    could be reached. A committer that others serve beside while it does not (leaving,
    or not registered) does not count: a leaving one's drain may already have scanned
    its store, and it exits with the copy. With no agent serving at all (the whole
    region stopping) it counts: its drain keeps its objects then (`drain_alone`)."""
    counted = not ranked or any(m.agent_id == self_id for m in ranked)
    holders = [self_id] if counted else []
    errors: list[str] = []
    for member in ranked:
        if len(holders) >= r:
            break
        if member.agent_id == self_id:
            continue
        try:
            await fetch_to(peers, member, dataset, key, version, region=region, source=source)
        except Exception as exc:  # noqa: BLE001 - any failure: try the next agent
            errors.append(f"{member.agent_id}: {exc}")
            log.warning(
                "copy_passed_over",
                dataset=dataset,
                key=key,
                agent=member.agent_id,
                error=str(exc),
            )
            continue
        holders.append(member.agent_id)
    if len(holders) < r:
        raise UnavailableError(
            f"{dataset}/{key} at {version.hlc} is committed on {len(holders)} of the "
            f"{r} agents of {region} it needs before an ack ({'; '.join(errors) or 'no agent'})"
        )
    return holders
