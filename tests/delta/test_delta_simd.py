"""The AVX2 paths (block sums, XXH3, the rolling scan) and the portable ones
write the same signature, delta and output bytes, for one thread and for two:
the format must not depend on the CPU that made it. The portable code is chosen
by an option the front passes (`portable=True`), not by an environment variable."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import native


def _edit(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(60):
        at = rng.randrange(len(out))
        match rng.randrange(3):
            case 0:
                out[at:at] = rng.randbytes(rng.randrange(1, 3000))
            case 1:
                del out[at : at + rng.randrange(1, 3000)]
            case _:
                out[at : at + 100] = rng.randbytes(100)
    # several MiB of new bytes (literal frames beyond the first, reused across
    # rounds), and a change in the last block (the scan's tail)
    mid = len(out) // 2
    out[mid : mid + (3 << 20)] = rng.randbytes(3 << 20)
    out[-10:] = b"0123456789"
    return bytes(out)


def _make(folder: Path, simd: bool, threads: int, old: Path, new: Path) -> dict[str, bytes]:
    out = folder / f"{'simd' if simd else 'portable'}-{threads}"
    sig, dlt, res = (Path(f"{out}.{ext}") for ext in ("sig", "delta", "out"))
    portable = not simd
    native.signature(old, sig, threads=threads, portable=portable)
    native.delta(sig, new, dlt, threads=threads, portable=portable)
    native.patch(old, dlt, res, threads=threads, portable=portable)
    # the numeric model too: planes and their hashes through both code paths
    native.delta_basis(old, new, f"{out}.basis", dtype="fp16", threads=threads, portable=portable)
    return {ext: Path(f"{out}.{ext}").read_bytes() for ext in ("sig", "delta", "out", "basis")}


def test_this_machine_has_avx2() -> None:
    """Otherwise both runs below would take the portable path and prove nothing."""
    with open("/proc/cpuinfo") as info:
        assert " avx2" in info.read()


@pytest.mark.parametrize("threads", [1, 2])
def test_simd_and_portable_paths_agree(tmp_path: Path, threads: int) -> None:
    rng = random.Random(7)
    # text-like and random regions and zeros, over several 4 MiB segments: the scan
    # meets hits, misses, block-aligned matches and segment ends
    words = [b"alpha ", b"beta ", b"gamma\n", b"delta "]
    base = (
        b"".join(rng.choice(words) for _ in range(700_000))
        + bytes(1 << 20)
        + rng.randbytes(5 << 20)
    )
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(base)
    new.write_bytes(_edit(base, rng))
    simd = _make(tmp_path, True, threads, old, new)
    portable = _make(tmp_path, False, threads, old, new)
    assert simd["sig"] == portable["sig"]
    assert simd["delta"] == portable["delta"]
    assert simd["basis"] == portable["basis"]
    assert simd["out"] == portable["out"] == new.read_bytes()
    # the delta found the unchanged bytes: not much more than the new ones
    assert len(simd["delta"]) < (3 << 20) + new.stat().st_size // 10
