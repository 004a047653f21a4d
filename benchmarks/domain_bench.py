"""Rates of the domain contracts on the hot path of every write and every apply.

    python benchmarks/domain_bench.py [--seconds 1.0]

Times, single-threaded, best of three runs of about --seconds each: HybridClock.now,
HLC.parse, lww, blake3 content digests (1 MiB buffers), and encoding and decoding a
ChangeEvent with 1 KiB inline (the Kafka record value, checked at the boundary).
Prints one line per measure.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, HybridClock
from controlplane.domain.version import Digest, Version, lww
from meridian.convert import decode_change_event, encode_change_event


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second, best of three runs of about `seconds` each."""
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                fn()
            calls += 1000
        best = max(best, calls / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    seconds = parser.parse_args().seconds

    clock = HybridClock("eu-west")
    data = b"x" * 1024
    event = ChangeEvent(
        event_id="e-1",
        dataset="corpus/web",
        key="part-0001.bin",
        version=Version.put(clock.now(), len(data), Digest.of(data)),
        origin_region="eu-west",
        policy_revision=3,
        inline=data,
    )
    record = encode_change_event(event)
    older = Version.put(HLC(1, 0, "eu-west"), len(data), Digest.of(data))
    mib = b"y" * (1 << 20)

    text = "1764579123456.00000@eu-west"
    measures: list[tuple[str, Callable[[], object], float, str]] = [
        ("HybridClock.now", clock.now, seconds, "/s"),
        ("HLC.parse", lambda: HLC.parse(text), seconds, "/s"),
        ("lww", lambda: lww(event.version, older), seconds, "/s"),
        ("Digest.of (blake3, 1 MiB)", lambda: Digest.of(mib), seconds / 4, "MiB/s"),
        ("encode ChangeEvent (1 KiB)", lambda: encode_change_event(event), seconds, "/s"),
        ("decode ChangeEvent (1 KiB)", lambda: decode_change_event(record), seconds, "/s"),
    ]
    for name, fn, budget, unit in measures:
        print(f"{name:<30}{rate(fn, budget):>12,.0f} {unit}")
    print(f"(a ChangeEvent record with 1 KiB inline is {len(record)} bytes)")


if __name__ == "__main__":
    main()
