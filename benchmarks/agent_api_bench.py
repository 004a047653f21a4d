"""Agent API benchmark: Put and Get through gRPC beside the store's own put, one run.

    python benchmarks/agent_api_bench.py                 # 512 MiB object, 256 x 64 KiB
    python benchmarks/agent_api_bench.py --mib 128 --small 64 --repeat 1

The agent (store + admission + `AgentService` + `start_server`) runs in a child
process on a free loopback port, so client and server do not share an event loop
or a GIL. For each workload, the same source bytes (random, in the page cache):

- `api put`: `Put` streams of 1 MiB chunks from the client, each durable when it
  returns (the store's write protocol: one-pass hash, fsync, rename, SQLite);
- `store put`: `ObjectStore.put` of the same bytes in this process, the floor the
  API's framing and thread hops add to;
- `api get`: `Get` of the object back, bytes counted (read from the page cache).

Best of `--repeat` rounds; the ratio is the API's time over the store's.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import tempfile
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

from agents.admission import Admission, OwnerRecord
from agents.metrics import AgentMetrics
from agents.service import AgentService, start_server, stop_server
from agents.store import CHUNK_BYTES, ObjectStore
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.coordination.timeutil import utcnow
from controlplane.domain.hlc import HybridClock
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy
from meridian.v1 import agent_pb2, agent_pb2_grpc

MiB = 1 << 20
REGION = "eu-west"
DATASET = "bench/objects"


class _Policy:
    def __init__(self) -> None:
        placement = Placement(
            dataset=DATASET,
            policy="bench",
            dataset_class="standard",
            home=REGION,
            replicas=(),
            residency=("EU",),
            rpo_s=60,
            failover_mode="manual",
            failover_order=(),
        )
        self.snapshot = CompiledPolicy(
            digest="bench",
            revision=1,
            applied_at=utcnow(),
            regions={REGION: "EU"},
            links={},
            placements={DATASET: placement},
            rules={"regions": {REGION: {"jurisdiction": "EU"}}, "policies": {}},
        )

    def require(self) -> CompiledPolicy:
        return self.snapshot


class _NoOwners:
    async def owner(self, dataset: str) -> OwnerRecord | None:
        return None

    def known(self, dataset: str) -> OwnerRecord | None:
        return None


def _serve(root: str, conn: Connection) -> None:
    async def main() -> None:
        store = ObjectStore(root, clock=HybridClock(REGION))
        metrics = AgentMetrics(REGION, "bench")
        admission = Admission(REGION, _Policy(), FencedResource(), _NoOwners(), metrics)
        service = AgentService(store, admission, REGION, "bench", metrics)
        server, port = await start_server(service, "127.0.0.1:0")
        conn.send(port)
        await asyncio.to_thread(conn.recv)  # the parent says when to stop
        await stop_server(server, 1.0)
        store.close()

    asyncio.run(main())


async def _chunks(path: Path, size: int, key: str) -> AsyncIterator[agent_pb2.PutRequest]:
    yield agent_pb2.PutRequest(header=agent_pb2.PutHeader(dataset=DATASET, key=key, size=size))
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield agent_pb2.PutRequest(chunk=chunk)
    yield agent_pb2.PutRequest(end=agent_pb2.PutEnd())


async def _api_round(port: int, sources: list[Path], tag: str) -> tuple[float, float]:
    sizes = [p.stat().st_size for p in sources]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        started = time.perf_counter()
        for i, path in enumerate(sources):
            await stub.Put(_chunks(path, sizes[i], f"{tag}-{i}"), timeout=600)
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        got = 0
        for i in range(len(sources)):
            async for msg in stub.Get(
                agent_pb2.GetRequest(dataset=DATASET, key=f"{tag}-{i}"), timeout=600
            ):
                got += len(msg.chunk)
        get_s = time.perf_counter() - started
    assert got == sum(sizes)
    return put_s, get_s


def _store_round(root: Path, sources: list[Path], tag: str) -> float:
    with ObjectStore(root, clock=HybridClock(REGION)) as store:
        started = time.perf_counter()
        for i, path in enumerate(sources):
            with path.open("rb") as fh:
                store.put(DATASET, f"{tag}-{i}", fh)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="size of the large object")
    parser.add_argument("--small", type=int, default=256, help="count of 64 KiB objects")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agent-api-bench-") as tmp:
        base = Path(tmp)
        (base / "src").mkdir()
        large = base / "src" / "large.bin"
        with large.open("wb") as fh:
            for _ in range(args.mib):
                fh.write(os.urandom(MiB))
        small = []
        for i in range(args.small):
            path = base / "src" / f"small-{i:05d}.bin"
            path.write_bytes(os.urandom(64 * 1024))
            small.append(path)

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        server = ctx.Process(target=_serve, args=(str(base / "agent"), child))
        server.start()
        try:
            port = parent.recv()
            print(f"agent on 127.0.0.1:{port}; best of {args.repeat}")
            print(f"{'workload':<22}{'api put':>12}{'store put':>12}{'ratio':>8}{'api get':>12}")
            for name, sources in (
                (f"1 x {args.mib} MiB", [large]),
                (f"{args.small} x 64 KiB", small),
            ):
                total = sum(p.stat().st_size for p in sources) / MiB
                best_put = best_get = best_store = float("inf")
                for r in range(args.repeat):
                    put_s, get_s = asyncio.run(_api_round(port, sources, f"{name}-{r}"))
                    store_s = _store_round(base / f"store-{r}-{len(sources)}", sources, "s")
                    best_put, best_get = min(best_put, put_s), min(best_get, get_s)
                    best_store = min(best_store, store_s)
                print(
                    f"{name:<22}{total / best_put:>8.0f} MB/s{total / best_store:>8.0f} MB/s"
                    f"{best_put / best_store:>7.2f}x{total / best_get:>8.0f} MB/s"
                )
        finally:
            parent.send("stop")
            server.join(30)


if __name__ == "__main__":
    main()
