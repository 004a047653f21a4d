"""Records benchmark: how fast an agent's records leave it, one run, a table.

    python benchmarks/records_bench.py                     # 5,000 records, both catalogs
    python benchmarks/records_bench.py --count 20000 --kafka 127.0.0.1:9092

- `recorder → catalog`: a store's journal of COUNT versions (written with
  `put_many`, so writing is not what is measured) shipped by `Recorder.ship_pending`
  in batches of `--batch` until caught up, into a fresh catalog (SQLite file, and the
  stack's PostgreSQL) with the example policy applied; one transaction per batch.
- `outbox → Kafka`: COUNT change events of 1 KiB objects (inline) published by
  `OutboxDrain.step` until the outbox is empty, through the idempotent `acks=all`
  producer, to the stack's broker.

The reference is the rate the data path can fill them at: the store's own
`put_many` of the same objects (durable commits, 500 per call), so a ratio >= 1
means the records keep up with the writes that make them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import bench_harness  # noqa: F401 - puts tests/ on the path
from bench_harness import scratch_catalog

from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings, Recorder, RecorderSettings
from agents.store import ObjectStore
from controlplane.adapters.kafka import KafkaProducer
from controlplane.domain.hlc import HybridClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "records"))
from records_helpers import DATASET, REGION, applied_catalog

DEFAULT_PG = "postgresql+psycopg://meridian@127.0.0.1:15432/meridian"
PER_CALL = 500


def fill(store: ObjectStore, dataset: str, count: int, *, outbox: bool) -> float:
    """Write COUNT 1 KiB objects; return the rate (objects/s)."""
    t0 = time.perf_counter()
    for start in range(0, count, PER_CALL):
        items = [
            (dataset, f"k{i}", [os.urandom(1024)])
            for i in range(start, min(count, start + PER_CALL))
        ]
        store.put_many(items, outbox=outbox, policy_revision=1)  # type: ignore[arg-type]
    return count / (time.perf_counter() - t0)


def bench_recorder(
    backend: str, url: str, root: Path, count: int, batch: int
) -> tuple[float, float]:
    catalog = applied_catalog(url)
    store = ObjectStore(root, clock=HybridClock(REGION))
    try:
        written = fill(store, DATASET, count, outbox=False)
        recorder = Recorder(
            store, catalog, AgentMetrics(REGION), REGION, RecorderSettings(batch_size=batch)
        )
        t0 = time.perf_counter()
        shipped = 0
        while done := recorder.ship_pending():
            shipped += done
        return shipped / (time.perf_counter() - t0), written
    finally:
        store.close()
        catalog.close()


async def bench_drain(bootstrap: str, root: Path, count: int, batch: int) -> tuple[float, float]:
    store = ObjectStore(root, clock=HybridClock(REGION))
    try:
        written = fill(store, f"corpus/bench-{uuid.uuid4().hex[:6]}", count, outbox=True)
        settings = OutboxSettings(origin_agent="127.0.0.1:1", batch_size=batch)
        async with KafkaProducer(bootstrap) as producer:
            drain = OutboxDrain(store, producer, AgentMetrics(REGION), REGION, settings)
            t0 = time.perf_counter()
            published = 0
            while done := await drain.step():
                published += done
            return published / (time.perf_counter() - t0), written
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument(
        "--postgres", default=os.environ.get("MERIDIAN_TEST_POSTGRES_URL", DEFAULT_PG)
    )
    parser.add_argument("--kafka", default=os.environ.get("MERIDIAN_KAFKA", "127.0.0.1:9092"))
    args = parser.parse_args(argv)
    rows: list[tuple[str, float, float]] = []
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    with tempfile.TemporaryDirectory() as tmp:
        for n, backend in enumerate(backends):
            pg = args.postgres if backend == "postgresql" else None
            with scratch_catalog(backend, Path(tmp), pg) as url:
                rate, written = bench_recorder(
                    backend, url, Path(tmp) / f"r{n}", args.count, args.batch
                )
            rows.append((f"recorder → catalog ({backend})", rate, written))
        rate, written = asyncio.run(
            bench_drain(args.kafka, Path(tmp) / "d", args.count, args.batch)
        )
        rows.append(("outbox → Kafka (1 KiB inline)", rate, written))
    print(f"{args.count} records, batches of {args.batch}")
    print(f"{'path':34} {'records/s':>10} {'writes/s':>10} {'ratio':>6}")
    for name, rate, written in rows:
        print(f"{name:34} {rate:10.0f} {written:10.0f} {rate / written:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
