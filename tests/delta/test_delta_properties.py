"""Property tests: random bases and edit scripts round-trip, and the delta does not
depend on the thread count (bases span several 4 MiB segments)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from delta_helpers import round_trip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native

EDIT = st.tuples(
    st.sampled_from(["insert", "delete", "replace", "append", "truncate", "move"]),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.integers(1, 70_000),
)


def apply_edits(
    base: bytes, edits: list[tuple[str, float, float, int]], rng: random.Random
) -> bytes:
    data = bytearray(base)
    for op, where, other, size in edits:
        at = int(where * len(data))
        if op == "insert":
            data[at:at] = rng.randbytes(size)
        elif op == "delete":
            del data[at : at + size]
        elif op == "replace":
            data[at : at + size] = rng.randbytes(min(size, max(0, len(data) - at)))
        elif op == "append":
            data += rng.randbytes(size)
        elif op == "truncate":
            del data[len(data) - min(size, len(data)) :]
        else:  # move a range elsewhere
            piece = bytes(data[at : at + size])
            del data[at : at + size]
            to = int(other * len(data))
            data[to:to] = piece
    return bytes(data)


def make_base(seed: int, size: int, text: bool) -> bytes:
    rng = random.Random(seed)
    if not text:
        return rng.randbytes(size)
    words = [rng.randbytes(rng.randint(2, 9)).hex() for _ in range(500)]
    out: list[str] = []
    total = 0
    while total < size:
        w = rng.choice(words)
        out.append(w)
        total += len(w) + 1
    return " ".join(out).encode()[:size]


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(0, 300_000),
    text=st.booleans(),
    block=st.sampled_from([None, 256, 1024, 4096]),
    edits=st.lists(EDIT, max_size=8),
)
def test_small_files_round_trip(
    seed: int, size: int, text: bool, block: int | None, edits: list[tuple[str, float, float, int]]
) -> None:
    base = make_base(seed, size, text)
    new = apply_edits(base, edits, random.Random(seed + 1))
    with tempfile.TemporaryDirectory() as tmp:
        round_trip(Path(tmp), base, new, block_size=block)


@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(4_000_000, 13_000_000),
    block=st.sampled_from([None, 512, 65536]),
    edits=st.lists(EDIT, min_size=1, max_size=6),
)
def test_thread_count_never_changes_a_byte(
    seed: int, size: int, block: int | None, edits: list[tuple[str, float, float, int]]
) -> None:
    base = make_base(seed, size, text=seed % 2 == 0)
    new = apply_edits(base, edits, random.Random(seed + 1))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        first = round_trip(folder, base, new, threads=1, block_size=block)
        sig1 = (folder / "sig").read_bytes()
        for threads in (2, 3, 4):
            native.signature(
                folder / "old", folder / f"sig{threads}", threads=threads, block_size=block
            )
            assert (folder / f"sig{threads}").read_bytes() == sig1
            native.delta(folder / "sig", folder / "new", folder / f"d{threads}", threads=threads)
            assert (folder / f"d{threads}").read_bytes() == first
