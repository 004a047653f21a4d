"""The AVX2 paths (block sums, XXH3, the rolling scan) and the portable ones
write the same signature, delta and output bytes: the format must not depend on
the CPU that made it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

_RUN = """
import sys
import native
old, new, out = sys.argv[1:4]
native.signature(old, out + ".sig")
native.delta(out + ".sig", new, out + ".delta")
native.patch(old, out + ".delta", out + ".out")
"""


def _edit(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(40):
        at = rng.randrange(len(out))
        match rng.randrange(3):
            case 0:
                out[at:at] = rng.randbytes(rng.randrange(1, 3000))
            case 1:
                del out[at : at + rng.randrange(1, 3000)]
            case _:
                out[at : at + 100] = rng.randbytes(100)
    return bytes(out)


def _make(folder: Path, simd: bool, old: Path, new: Path) -> dict[str, bytes]:
    env = dict(os.environ)
    env["MERIDIAN_DELTA_NO_SIMD"] = "0" if simd else "1"
    out = folder / ("simd" if simd else "portable")
    subprocess.run([sys.executable, "-c", _RUN, str(old), str(new), str(out)], env=env, check=True)
    return {ext: Path(f"{out}.{ext}").read_bytes() for ext in ("sig", "delta", "out")}


def test_simd_and_portable_paths_agree(tmp_path: Path) -> None:
    rng = random.Random(7)
    # text-like and random regions, zeros, and edits at every scale: the scan
    # meets hits, misses and block-aligned matches
    base = (
        b"".join(rng.choice([b"alpha ", b"beta ", b"gamma\n", b"delta "]) for _ in range(200_000))
        + bytes(300_000)
        + rng.randbytes(1_500_000)
    )
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(base)
    new.write_bytes(_edit(base, rng))
    simd = _make(tmp_path, True, old, new)
    portable = _make(tmp_path, False, old, new)
    assert simd["sig"] == portable["sig"]
    assert simd["delta"] == portable["delta"]
    assert simd["out"] == portable["out"] == new.read_bytes()
    # the delta found the unchanged bytes: far smaller than NEW
    assert len(simd["delta"]) < new.stat().st_size // 4
