"""Catalog benchmark: bulk-load a synthetic catalog, then time every audit command.

    python benchmarks/catalog_bench.py                      # SQLite and PostgreSQL, full size
    python benchmarks/catalog_bench.py --backend sqlite --scale 0.01

Full size: 10 regions in 4 jurisdictions, 1,000 datasets, 500,000 objects,
1,000,000 object versions, 3,000,000 replicas, 3,000,000 transfers, 1,000 failovers,
plus a planted set of residency violations (7 replicas, 5 transfers). Targets: bulk
load >= 100,000 rows/s; each audit command < 1 s and finding exactly the planted
violations. PostgreSQL comes from --postgres, MERIDIAN_TEST_POSTGRES_URL, or the
local stack's default (postgresql+psycopg://meridian@127.0.0.1:15432/meridian).
Each run uses a fresh database (SQLite file or PostgreSQL database) and drops it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_harness import scratch_catalog

from controlplane.catalog.api import open_catalog
from controlplane.cli.main import run
from controlplane.domain.placement import Placement

REGIONS = [
    ("eu-west", "EU"), ("eu-central", "EU"), ("eu-north", "EU"),
    ("us-east", "US"), ("us-west", "US"), ("us-central", "US"),
    ("cn-north", "CN"), ("cn-east", "CN"),
    ("jp-east", "JP"), ("jp-west", "JP"),
]  # fmt: skip
JUR = dict(REGIONS)
# Residency pattern by dataset index % 4, and the three regions holding each version.
PATTERNS = [
    (["EU"], ["eu-west", "eu-central", "eu-north"]),
    (["US"], ["us-east", "us-west", "us-central"]),
    (["EU", "US"], ["eu-west", "us-east", "eu-central"]),
    (["CN", "JP"], ["cn-north", "jp-east", "cn-east"]),
]
PLANTED_REPLICAS = 7
PLANTED_TRANSFERS = 5
PENDING_EVERY = 50  # one object in 50 has its latest version still pending on replicas
DEFAULT_PG = "postgresql+psycopg://meridian@127.0.0.1:15432/meridian"


@dataclass(frozen=True)
class Shape:
    datasets: int
    objects_per_dataset: int
    versions_per_object: int = 2

    @property
    def versions(self) -> int:
        return self.datasets * self.objects_per_dataset * self.versions_per_object


def shape_for(scale: float) -> Shape:
    return Shape(datasets=1000, objects_per_dataset=max(1, round(500 * scale)))


def ds_name(i: int) -> str:
    return f"ds-{i:04d}"


def outside_region(i: int) -> str:
    """A region outside dataset i's residency (for planted violations)."""
    residency = PATTERNS[i % 4][0]
    return next(r for r, j in REGIONS if j not in residency)


class Synth:
    """Deterministic synthetic rows. Ids are dense from 1, in load order."""

    def __init__(self, shape: Shape, now: datetime) -> None:
        self.shape = shape
        # Naive UTC: the bulk loader takes naive timestamps as UTC, and skips the
        # cost of converting aware ones.
        self.now = now.astimezone(UTC).replace(tzinfo=None)
        self.start = self.now - timedelta(days=30)

    def regions(self) -> Iterator[tuple[Any, ...]]:
        yield from REGIONS

    def datasets(self) -> Iterator[tuple[Any, ...]]:
        for i in range(self.shape.datasets):
            residency, holders = PATTERNS[i % 4]
            cls = "critical" if i % 2 else "standard"
            labels = {"team": f"t{i % 7}"}
            placement = Placement(
                dataset=ds_name(i),
                policy=f"policy-{i % 4}",
                dataset_class=cls,
                home=holders[0],
                replicas=tuple(holders[1:]),
                residency=tuple(residency),
                rpo_s=0 if cls == "critical" else 30,
                failover_mode="automatic",
                failover_order=tuple(holders[1:]),
                labels=labels,
            )
            yield (
                ds_name(i),
                labels,
                True,
                f"policy-{i % 4}",
                cls,
                holders[0],
                holders[1:],
                residency,
                "automatic",
                holders[1:],
                self.start,
                placement.as_json(),
            )

    def objects(self) -> Iterator[tuple[Any, ...]]:
        oid = 0
        for i in range(self.shape.datasets):
            for k in range(self.shape.objects_per_dataset):
                oid += 1
                yield (oid, ds_name(i), f"shard-{k:05d}.bin")

    def _version_ids(self) -> Iterator[tuple[int, int, int, int]]:
        """(version id, object id, dataset index, version number)."""
        vid = oid = 0
        for i in range(self.shape.datasets):
            for _ in range(self.shape.objects_per_dataset):
                oid += 1
                for n in range(self.shape.versions_per_object):
                    vid += 1
                    yield vid, oid, i, n

    def versions(self) -> Iterator[tuple[Any, ...]]:
        step = timedelta(days=30) / max(1, self.shape.versions)
        for vid, oid, i, _ in self._version_ids():
            yield (
                vid,
                oid,
                f"{1_700_000_000_000 + vid}-0-{PATTERNS[i % 4][1][0]}",
                f"{vid:064x}",
                1 << 20,
                PATTERNS[i % 4][1][0],
                self.start + step * vid,
                f"{1_700_000_000_000 + vid:013d}.00000@{PATTERNS[i % 4][1][0]}",
            )

    def replicas(self) -> Iterator[tuple[Any, ...]]:
        rid = 0
        for vid, oid, i, n in self._version_ids():
            residency, holders = PATTERNS[i % 4]
            for r in holders:
                rid += 1
                latest = n == self.shape.versions_per_object - 1
                lagging = latest and oid % PENDING_EVERY == 0 and r != holders[0]
                state = "pending" if lagging else "completed"
                verified = f"{vid:064x}" if state == "completed" else None
                yield (rid, vid, r, JUR[r], JUR[r] in residency, state, self.start, verified)
        # Planted: extra replicas of the first versions of the first datasets, outside.
        per_ds = self.shape.objects_per_dataset * self.shape.versions_per_object
        for p in range(PLANTED_REPLICAS):
            rid += 1
            i = p % self.shape.datasets
            r = outside_region(i)
            yield (
                rid,
                i * per_ds + 1 + p // self.shape.datasets,
                r,
                JUR[r],
                False,
                "completed",
                self.now - timedelta(minutes=p),
                f"{i * per_ds + 1 + p // self.shape.datasets:064x}",
            )

    def transfers(self) -> Iterator[tuple[Any, ...]]:
        total = self.shape.versions * 3
        step = timedelta(days=30) / max(1, total)
        # Scatter each dataset's transfers over the 30 days: t -> t * spread mod total is
        # a permutation (spread is coprime to total) close to the golden ratio, so any
        # run of consecutive t lands evenly across the whole window.
        spread = int(total * 0.6180339887) | 1
        while math.gcd(spread, total) != 1:
            spread += 2
        t = 0
        for vid, oid, i, _ in self._version_ids():
            residency, holders = PATTERNS[i % 4]
            # Two copies from home, and one re-copy between the replicas.
            for src, dst in (
                (holders[0], holders[1]),
                (holders[0], holders[2]),
                (holders[1], holders[2]),
            ):
                t += 1
                yield (
                    f"t{t:09d}",
                    ds_name(i),
                    f"shard-{(oid - 1) % self.shape.objects_per_dataset:05d}.bin",
                    f"v{vid}",
                    src,
                    dst,
                    JUR[src],
                    JUR[dst],
                    1 << 20,
                    1 << 17,
                    1,
                    "completed",
                    JUR[src] != JUR[dst],
                    JUR[dst] in residency,
                    residency,
                    self.start + step * ((t * spread) % total),
                )
        for p in range(PLANTED_TRANSFERS):
            i = (p * 37) % self.shape.datasets
            residency, holders = PATTERNS[i % 4]
            dst = outside_region(i)
            yield (
                f"planted-{p}",
                ds_name(i),
                "shard-00000.bin",
                "v1",
                holders[0],
                dst,
                JUR[holders[0]],
                JUR[dst],
                1 << 20,
                1 << 17,
                1,
                "completed",
                JUR[holders[0]] != JUR[dst],
                False,
                residency,
                self.now - timedelta(minutes=10 + p),
            )

    def failovers(self) -> Iterator[tuple[Any, ...]]:
        for f in range(1000):
            i = f % self.shape.datasets
            holders = PATTERNS[i % 4][1]
            at = self.start + timedelta(minutes=43 * f)
            yield (
                f"f{f:05d}",
                ds_name(i),
                holders[0],
                holders[1],
                10 + f,
                "failover",
                "drill",
                "bench",
                at,
                at,
                at + timedelta(seconds=4),
                0,
                "",
            )


TABLES: list[tuple[str, list[str], str]] = [
    ("regions", ["name", "jurisdiction"], "regions"),
    ("datasets", ["name", "labels", "declared", "policy", "dataset_class", "home", "replicas",
                  "residency", "failover_mode", "failover_order", "registered_at", "placement"],
     "datasets"),
    ("objects", ["id", "dataset", "key"], "objects"),
    ("object_versions", ["id", "object_id", "version", "digest", "size", "origin_region",
                         "created_at", "hlc"], "versions"),
    ("replicas", ["id", "version_id", "region", "jurisdiction", "allowed", "state",
                  "updated_at", "verified_digest"], "replicas"),
    ("transfers", ["id", "dataset", "object", "version", "from_region", "to_region",
                   "from_jurisdiction", "to_jurisdiction", "logical_bytes", "wire_bytes",
                   "policy_revision", "outcome", "cross_border", "allowed", "residency", "at"],
     "transfers"),
    ("failovers", ["id", "dataset", "from_region", "to_region", "epoch", "kind", "reason",
                   "actor", "detected_at", "started_at", "completed_at", "rpo_versions",
                   "details"], "failovers"),
]  # fmt: skip


class TimedRows:
    """Wraps the synthetic row generator and adds up the time spent making rows, so
    the loader's own rate can be told apart from the generator's. Rows are made and
    timed a chunk at a time: timing each row would cost more than making it."""

    CHUNK = 10_000

    def __init__(self, rows: Iterator[tuple[Any, ...]]) -> None:
        self._rows = rows
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while True:
            start, cpu = time.perf_counter(), time.process_time()
            chunk = list(itertools.islice(self._rows, self.CHUNK))
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.process_time() - cpu
            if not chunk:
                return
            yield from chunk


@dataclass
class Timing:
    backend: str
    measure: str
    seconds: float
    rows: int
    ok: bool
    note: str = ""


def cli(argv: list[str]) -> tuple[int, Any, float]:
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = run(argv)
    elapsed = time.perf_counter() - start
    return code, json.loads(out.getvalue() or "null"), elapsed


def bench_backend(backend: str, url: str, shape: Shape, log: Callable[[str], None]) -> list[Timing]:
    results: list[Timing] = []
    now = datetime.now(UTC).replace(microsecond=0)
    synth = Synth(shape, now)
    cat = open_catalog(url)
    try:
        total_rows = 0
        gen_s = gen_cpu = 0.0
        load_start, cpu_start = time.perf_counter(), time.process_time()
        for table, columns, method in TABLES:
            t0 = time.perf_counter()
            source = TimedRows(getattr(synth, method)())
            n = cat.bulk_load(table, columns, source, defer_checks=True)
            dt = time.perf_counter() - t0
            total_rows += n
            gen_s += source.seconds
            gen_cpu += source.cpu_seconds
            log(
                f"  {backend}: {table}: {n:,} rows in {dt:.1f} s ({n / dt:,.0f} rows/s; "
                f"{source.seconds:.1f} s of it generating rows)"
            )
        load_s = time.perf_counter() - load_start
        loader_cpu = time.process_time() - cpu_start - gen_cpu
        rate = total_rows / load_s
        loader_rate = total_rows / max(1e-9, load_s - gen_s)
        results.append(
            Timing(
                backend,
                "bulk load, end to end (incl. generating rows)",
                load_s,
                total_rows,
                True,
                f"{rate:,.0f} rows/s (informational)",
            )
        )
        results.append(
            Timing(
                backend,
                "bulk load (loader: convert, insert/COPY, indexes, FK checks)",
                load_s - gen_s,
                total_rows,
                loader_rate >= 100_000,
                f"{loader_rate:,.0f} rows/s; {total_rows / max(1e-9, loader_cpu):,.0f} rows per "
                f"CPU-second of this process{' (all of SQLite)' if backend == 'sqlite' else ''}",
            )
        )
        t0 = time.perf_counter()
        cat.after_load([t for t, _, _ in TABLES])
        results.append(Timing(backend, "ANALYZE + sequences", time.perf_counter() - t0, 0, True))
    finally:
        cat.close()

    base = ["--catalog", url, "audit"]
    code, rows, dt = cli([*base, "residency", "-o", "json"])
    planted = {("replica", r) for r in range(PLANTED_REPLICAS)}
    kinds = [r["kind"] for r in rows]
    exact = (
        code == 3
        and kinds.count("replica") == PLANTED_REPLICAS
        and kinds.count("transfer") == PLANTED_TRANSFERS
        and all(r["jurisdiction"] not in r["allowed"] for r in rows)
    )
    del planted
    results.append(
        Timing(
            backend,
            "audit residency",
            dt,
            len(rows),
            exact and dt < 1,
            f"exit {code}; planted {PLANTED_REPLICAS}+{PLANTED_TRANSFERS}",
        )
    )
    for argv in [
        ["transfers", "--cross-border", "--since", "1h"],
        ["transfers", "--dataset", "ds-004*", "--since", "1d"],
        ["transfers", "--since", "10m"],
        ["dataset", "ds-0042"],
        ["failovers", "--since", "7d"],
        ["failovers"],
    ]:
        label = "audit " + " ".join(f"'{a}'" if "*" in a else a for a in argv)
        code, rows, dt = cli([*base, *argv, "-o", "json"])
        results.append(Timing(backend, label, dt, len(rows), code == 0 and dt < 1))
    # The coordination engineer's hot read: catch-up / RPO exposure of one dataset.
    cat = open_catalog(url)
    try:
        t0 = time.perf_counter()
        pending = cat.incomplete_versions("ds-0097", "us-west")
        dt = time.perf_counter() - t0
        first = 97 * shape.objects_per_dataset + 1
        expect = sum(
            1 for oid in range(first, first + shape.objects_per_dataset) if oid % PENDING_EVERY == 0
        )
        results.append(
            Timing(
                backend,
                "Catalog.incomplete_versions",
                dt,
                len(pending),
                dt < 1 and len(pending) == expect,
                f"expected {expect}",
            )
        )
        t0 = time.perf_counter()
        placements = cat.list_placements()
        dt = time.perf_counter() - t0
        results.append(Timing(backend, "Catalog.list_placements", dt, len(placements), dt < 1))
    finally:
        cat.close()
    return results


def table(results: list[Timing]) -> str:
    lines = [
        "| backend | measure | seconds | rows | target met | note |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {r.measure} | {r.seconds:.3f} | {r.rows:,} | "
            f"{'yes' if r.ok else 'NO'} | {r.note} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full size")
    parser.add_argument(
        "--postgres", default=os.environ.get("MERIDIAN_TEST_POSTGRES_URL", DEFAULT_PG)
    )
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the SQLite file")
    args = parser.parse_args(argv)
    shape = shape_for(args.scale)
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(
        f"shape: {shape.datasets:,} datasets, {shape.datasets * shape.objects_per_dataset:,} "
        f"objects, {shape.versions:,} versions, {shape.versions * 3:,} replicas and transfers"
    )
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    results: list[Timing] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for backend in backends:
            pg = args.postgres if backend == "postgresql" else None
            with scratch_catalog(backend, Path(tmp), pg) as url:
                results += bench_backend(backend, url, shape, log)
    print(table(results))
    load1, load5, _ = os.getloadavg()
    print(
        f"\n{shape.versions:,} object versions; machine: {os.cpu_count()} CPUs, load average "
        f"{load1:.1f} (1 min) / {load5:.1f} (5 min) at the end, from all users"
    )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
