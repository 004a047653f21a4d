"""The store's CPU per small write, in this process (issues 12 and 13), one run:

    python benchmarks/store_small_bench.py [--writers 32] [--seconds 4] [--bundles 20]
    bash benchmarks/store_small_ab.sh BASE_COMMIT [ROUNDS]     # before/after, alternated

Two workloads of 1 KiB objects into a fresh store under the temporary folder (where
the benchmarks' and tests' agents keep theirs):

* `put`: `--writers` threads each `put` 1 KiB objects (a standard dataset: outbox and
  journal rows) for `--seconds`, as the agent's Put handlers do under 32 writers
  (group commit): puts/s, CPU per put (all, and the kernel's part), this process's
  thread switches per put, items per group;
* `apply_many`: `--bundles` bundles of 200 new 1 KiB versions made elsewhere, as the
  replicator's `ReplicateMany` applies them: objects/s and CPU per object.

The store is where most of an agent's CPU per small write goes in the kernel (file
creation, fsyncs, thread switches), so its figures move with a change there before
the end-to-end benchmarks' (critical_bench.py, replication_bench.py) noisier ones.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agents.store import ObjectStore
from controlplane.domain.hlc import HybridClock
from controlplane.domain.version import Digest, Version

KiB = 1 << 10


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def puts(root: Path, writers: int, seconds: float) -> str:
    store = ObjectStore(root, clock=HybridClock("eu-west"))
    data = os.urandom(KiB)
    until = time.monotonic() + seconds
    counts = [0] * writers

    def writer(w: int) -> None:
        n = 0
        while time.monotonic() < until:
            store.put("plain/tput", f"w{w}-{n % 100}", [data], outbox=True)
            n += 1
        counts[w] = n

    u0, s0, c0 = _usage()
    started = time.monotonic()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    elapsed = time.monotonic() - started
    u1, s1, c1 = _usage()
    n = max(sum(counts), 1)
    stats = store.group_stats()
    store.close()
    return (
        f"put, {writers} writers: {n / elapsed:.0f} puts/s; CPU per put "
        f"{(u1 - u0 + s1 - s0) * 1e3 / n:.2f} ms (kernel {(s1 - s0) * 1e3 / n:.2f}); "
        f"thread switches per put {(c1 - c0) / n:.1f}; items per group "
        f"{stats.items / max(stats.groups, 1):.1f}"
    )


def applies(root: Path, bundles: int) -> str:
    store = ObjectStore(root, clock=HybridClock("eu-central"))
    origin = HybridClock("eu-west")
    work = []
    for b in range(bundles):
        bundle = []
        for i in range(200):
            data = os.urandom(KiB)
            version = Version.put(origin.now(), len(data), Digest.of(data))
            bundle.append(("corpus/a", f"k{b}-{i}", version, [data]))
        work.append(bundle)
    u0, s0, _ = _usage()
    started = time.monotonic()
    for bundle in work:
        store.apply_many(bundle)  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    u1, s1, _ = _usage()
    store.close()
    n = 200 * bundles
    return (
        f"apply_many, bundles of 200: {n / elapsed:.0f} objects/s; CPU per object "
        f"{(u1 - u0 + s1 - s0) * 1e6 / n:.0f} us (kernel {(s1 - s0) * 1e6 / n:.0f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--bundles", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the store's log lines
    with tempfile.TemporaryDirectory(prefix="store-small-") as tmp:
        print(puts(Path(tmp) / "put", args.writers, args.seconds), flush=True)
        print(applies(Path(tmp) / "apply", args.bundles), flush=True)


if __name__ == "__main__":
    main()
