"""Bundles: many small objects from one source in one SyncBundle stream, committed in
batches; large ones, refused ones and held ones take their own way."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from agents_inproc import AgentFactory
from xfer_helpers import content, transfers

from agents.transfer.pull import CHANNEL_OPTIONS
from controlplane.domain.version import Version
from meridian.convert import version_to_wire
from meridian.v1 import agent_pb2, agent_pb2_grpc


async def fetch_many(
    address: str, items: list[agent_pb2.FetchRequest]
) -> agent_pb2.FetchManyResponse:
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        response: agent_pb2.FetchManyResponse = await agent_pb2_grpc.AgentStub(channel).FetchMany(
            agent_pb2.FetchManyRequest(items=items), timeout=120
        )
        return response


async def test_small_objects_travel_in_one_bundle(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central")
    files = {f"shard/{n:05d}": content(4096, seed=n) for n in range(1500)}
    big = content(3 << 20, seed=99)
    versions = west.store.put_many([("ckpt", k, [v]) for k, v in files.items()])
    big_version = west.store.put("ckpt", "big.bin", [big])
    source = [agent_pb2.FetchSource(region="eu-west", address=west.address)]
    items = [
        agent_pb2.FetchRequest(dataset="ckpt", key=k, version=version_to_wire(v), sources=source)
        for k, v in zip(files, versions, strict=True)
    ]
    items.append(
        agent_pb2.FetchRequest(
            dataset="ckpt", key="big.bin", version=version_to_wire(big_version), sources=source
        )
    )

    got = await fetch_many(central.address, items)

    assert list(got.errors) == [""] * len(items)
    assert {r.outcome for r in got.results} == {agent_pb2.APPLY_OUTCOME_APPLIED}
    for key, data in files.items():
        assert central.store.read_bytes("ckpt", key) == data
    assert central.store.read_bytes("ckpt", "big.bin") == big
    records = transfers(central.store)
    bundles = [r for r in records if r["method"] == "bundle"]
    # Batches of one stream (they may commit in any order): the first is cut early, at
    # 1 MiB (256 items) as no commit is running yet; none exceeds BATCH_ITEMS.
    sizes = [r["items"] for r in bundles]
    assert sum(sizes) == 1500 and max(sizes) <= 1000 and len(sizes) >= 2
    assert 256 in sizes, sizes
    assert sum(r["logical_bytes"] for r in bundles) == 1500 * 4096
    assert [r["method"] for r in records if r["method"] != "bundle"] == ["raw"]  # the big one

    again = await fetch_many(central.address, items[:10])  # held already: nothing moves
    assert {r.outcome for r in again.results} == {agent_pb2.APPLY_OUTCOME_SAME}
    assert len(transfers(central.store)) == len(records)


async def test_a_refused_dataset_in_a_bundle_refuses_only_its_items(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    east = await agents("us-east")
    source = [agent_pb2.FetchSource(region="eu-west", address=west.address)]
    v = west.store.put("ckpt", "a", [b"eu only"])
    item = agent_pb2.FetchRequest(
        dataset="ckpt", key="a", version=version_to_wire(v), sources=source
    )

    got = await fetch_many(east.address, [item])

    assert got.errors[0].startswith("PERMISSION_DENIED")
    assert east.store.head("ckpt", "a") is None


def wanted(
    dataset: str, key: str, version: Version, region: str, address: str
) -> agent_pb2.FetchRequest:
    return agent_pb2.FetchRequest(
        dataset=dataset,
        key=key,
        version=version_to_wire(version),
        sources=[agent_pb2.FetchSource(region=region, address=address)],
    )


async def test_the_bundle_limit_is_the_agents_setting(agents: AgentFactory) -> None:
    west = await agents("eu-west")
    central = await agents("eu-central", bundle_max_bytes=2048)  # 4 KiB: too large
    files = {f"s/{n}": content(4096, seed=n) for n in range(5)}
    versions = west.store.put_many([("ckpt", k, [v]) for k, v in files.items()])
    items = [
        wanted("ckpt", k, v, "eu-west", west.address) for k, v in zip(files, versions, strict=True)
    ]

    got = await fetch_many(central.address, items)

    assert list(got.errors) == [""] * len(items)
    assert [r["method"] for r in transfers(central.store)] == ["raw"] * len(items)


async def test_a_move_inside_the_region_bundles_an_object_up_to_4_mib(
    agents: AgentFactory,
) -> None:
    """2 MiB is above the bundle limit: from another region it goes alone (resumable,
    a delta where a basis is held); moved between two agents of one region, to an agent
    that holds none of it, it rides a bundle."""
    west = await agents("eu-west")
    west2 = await agents("eu-west", name="eu-west-2")
    central = await agents("eu-central")
    data = content(2 << 20, seed=7)
    version = west.store.put("ckpt", "shard.bin", [data])

    got = await fetch_many(
        west2.address,
        [wanted("ckpt", "shard.bin", version, "eu-west", west.address)],
    )
    assert list(got.errors) == [""]
    assert [r["method"] for r in transfers(west2.store)] == ["bundle"]
    assert west2.store.read_bytes("ckpt", "shard.bin") == data

    got = await fetch_many(
        central.address,
        [wanted("ckpt", "shard.bin", version, "eu-west", west.address)],
    )
    assert list(got.errors) == [""]
    assert [r["method"] for r in transfers(central.store)] != ["bundle"]
    assert central.store.read_bytes("ckpt", "shard.bin") == data


async def test_a_fetch_many_sends_its_first_slice_before_classifying_the_rest(
    agents: AgentFactory,
) -> None:
    """The first 256 items leave in a bundle of their own, so the link is busy while the
    rest is classified; the rest follows in a second bundle. Every item arrives."""
    west = await agents("eu-west")
    central = await agents("eu-central")
    files = {f"s/{n:04d}": content(4096, seed=n) for n in range(1000)}
    versions = west.store.put_many([("ckpt", k, [v]) for k, v in files.items()])
    served: list[int] = []
    serve = west.service.bundler.serve

    def spy(request: agent_pb2.SyncBundleRequest) -> AsyncIterator[agent_pb2.SyncBundleResponse]:
        served.append(len(request.items))
        return serve(request)

    west.service.bundler.serve = spy  # type: ignore[method-assign]
    items = [
        wanted("ckpt", k, v, "eu-west", west.address) for k, v in zip(files, versions, strict=True)
    ]

    got = await fetch_many(central.address, items)

    assert list(got.errors) == [""] * len(items)
    assert {r.outcome for r in got.results} == {agent_pb2.APPLY_OUTCOME_APPLIED}
    assert [r.held for r in got.results] == [version_to_wire(v) for v in versions]
    assert sorted(served) == [256, 744]
    for key, data in files.items():
        assert central.store.read_bytes("ckpt", key) == data
    assert sum(r["items"] for r in transfers(central.store) if r["method"] == "bundle") == 1000


async def test_a_bundle_starts_with_small_packed_frames(agents: AgentFactory) -> None:
    """The first packed frame carries 8 items of 4 KiB (32 KiB), each next one as much
    as all before it, up to 256 KiB: the first bytes leave after a few reads, and the
    frames still end at 1 MiB, where the receiver cuts its first batch."""
    west = await agents("eu-west")
    files = {f"r/{n:04d}": content(4096, seed=n) for n in range(400)}
    versions = west.store.put_many([("ckpt", k, [v]) for k, v in files.items()])
    request = agent_pb2.SyncBundleRequest(
        items=[
            agent_pb2.BundleItem(dataset="ckpt", key=k, version=version_to_wire(v))
            for k, v in zip(files, versions, strict=True)
        ],
        receiver_region="eu-central",
        packed=True,
    )
    async with grpc.aio.insecure_channel(west.address, options=CHANNEL_OPTIONS) as channel:
        frames = [f async for f in agent_pb2_grpc.AgentStub(channel).SyncBundle(request)]

    counts = [len(f.pack.entries) for f in frames]
    assert counts == [8, 8, 16, 32, 64, 64, 64, 64, 64, 16], counts
    got = [e.content for f in frames for e in f.pack.entries]
    assert got == list(files.values())
