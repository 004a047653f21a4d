"""Delta format v2 through the Python front: numeric deltas with OLD at hand
(safetensors and --dtype), old deltas still patching, a patch fed as it arrives
(pipe, socket, chunks) with no spool, the output cap, the wrong-basis refusal from
per-frame hashes, a truncated OLD, and the engine thread joined on the way out."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from delta_helpers import listing

import native
from controlplane.cli.main import run
from controlplane.errors import InvalidInputError

DATA = Path(__file__).parent / "data"


# ---------------------------------------------------------------- safetensors


def _st(tensors: dict[str, tuple[str, bytes]], pad: int = 0) -> bytes:
    """A safetensors file: tensors laid out in the order given."""
    widths = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": [len(raw) // widths[dtype]],
            "data_offsets": [off, off + len(raw)],
        }
        off += len(raw)
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + b"".join(raw for _, raw in tensors.values())


def _fp32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _weights(rng: random.Random, n: int) -> list[float]:
    return [rng.gauss(0, 0.02) for _ in range(n)]


def _step(values: list[float], rng: random.Random, lr: float = 3e-4) -> list[float]:
    return [v - lr * rng.choice((-1.0, 1.0)) * rng.random() for v in values]


SPECIAL = [math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-45, -1e-45, 1e-39, 3.4e38]


def _checkpoints(
    rng: random.Random,
) -> tuple[dict[str, tuple[str, bytes]], dict[str, tuple[str, bytes]]]:
    a = _weights(rng, 60_000) + SPECIAL
    b = _weights(rng, 40_000)
    old = {"layer.a": ("F32", _fp32(a)), "layer.b": ("F32", _fp32(b))}
    a2 = [
        *_step(a[:-10], rng),
        math.inf,
        math.nan,
        -0.0,
        0.0,
        -1e-45,
        1e-45,
        1e-40,
        -math.inf,
        5.0,
        -0.0,
    ]
    new = {"layer.a": ("F32", _fp32(a2)), "layer.b": ("F32", _fp32(_step(b, rng)))}
    return old, new


def _basis_round_trip(
    folder: Path, old: bytes, new: bytes, dtype: str | None = None
) -> native.DeltaStats:
    (folder / "old").write_bytes(old)
    (folder / "new").write_bytes(new)
    stats = native.delta_basis(folder / "old", folder / "new", folder / "delta", dtype=dtype)
    native.patch(folder / "old", folder / "delta", folder / "out")
    assert (folder / "out").read_bytes() == new  # bit-exact: NaN payloads, -0, denormals
    return stats


def test_safetensors_numeric_delta_is_exact_and_smaller(tmp_path: Path) -> None:
    old_t, new_t = _checkpoints(random.Random(1))
    old, new = _st(old_t), _st(new_t)
    stats = _basis_round_trip(tmp_path, old, new)
    assert stats.numeric_bytes > 0.9 * len(new)
    numeric = (tmp_path / "delta").stat().st_size
    # the rolling-hash delta of the same pair finds no block to copy
    native.signature(tmp_path / "old", tmp_path / "sig")
    native.delta(tmp_path / "sig", tmp_path / "new", tmp_path / "sig.delta")
    assert numeric < 0.8 * (tmp_path / "sig.delta").stat().st_size


def test_tensors_added_removed_reordered_resized_cost_only_themselves(tmp_path: Path) -> None:
    rng = random.Random(2)
    old_t, new_t = _checkpoints(rng)
    _basis_round_trip(tmp_path, _st(old_t), _st(new_t))
    size = (tmp_path / "delta").stat().st_size
    extra = rng.randbytes(30_000)
    # reordered, one tensor gained at the front, one removed from OLD, one resized
    old2 = {**old_t, "gone": ("F32", rng.randbytes(8000)), "grow": ("F32", rng.randbytes(4000))}
    new2 = {
        "gained": ("I8", extra),
        "layer.b": new_t["layer.b"],
        "grow": ("F32", rng.randbytes(4400)),
        "layer.a": new_t["layer.a"],
    }
    stats = _basis_round_trip(tmp_path, _st(old2), _st(new2))
    assert stats.numeric_bytes >= len(new_t["layer.a"][1]) + len(new_t["layer.b"][1])
    # random bytes cost their size (raw literals), plus frame overheads and the header
    assert (tmp_path / "delta").stat().st_size <= size + len(extra) + 4400 + 1024


def test_unchanged_tensor_is_a_copy(tmp_path: Path) -> None:
    old_t, new_t = _checkpoints(random.Random(3))
    new_t["layer.b"] = old_t["layer.b"]
    stats = _basis_round_trip(tmp_path, _st(old_t), _st(new_t))
    assert stats.copy_bytes >= len(old_t["layer.b"][1])


def test_dtype_for_a_raw_file(tmp_path: Path) -> None:
    rng = random.Random(4)
    a = _weights(rng, 50_000) + SPECIAL
    old = _fp32(a)
    new = _fp32(_step(a, rng)) + b"tail"
    stats = _basis_round_trip(tmp_path, old, new, dtype="fp32")
    assert stats.numeric_bytes == len(old)
    with pytest.raises(InvalidInputError, match="--dtype must be one of"):
        native.delta_basis(tmp_path / "old", tmp_path / "new", tmp_path / "d2", dtype="fp12")


def test_a_chunk_the_numeric_model_barely_shrinks_goes_as_a_literal(tmp_path: Path) -> None:
    """--dtype over text-like NEW whose elements differ from OLD's by up to 2^28: the
    numeric frames shrink each chunk by ~9% only (three noise planes, one of 5 bits),
    zstd shrinks the text by ~70%, so each 1 MiB chunk must become a literal frame.
    Chunks this large decide from a sample whether to try the literal coding in full
    (md_basis.c, literal_cost), and the sample must say yes here."""
    rng = random.Random(6)
    words = [
        bytes(rng.choice(b"etaoinshrdlu") for _ in range(rng.randint(2, 9))) for _ in range(400)
    ]
    size = 3 << 20
    new = b" ".join(rng.choice(words) for _ in range(size // 5))[:size]
    n = size // 4
    values = struct.unpack(f"<{n}I", new)
    old = struct.pack(f"<{n}I", *((v - rng.randrange(1 << 28)) % (1 << 32) for v in values))
    stats = _basis_round_trip(tmp_path, old, new, dtype="fp32")
    assert stats.literal_bytes == len(new)
    assert stats.numeric_bytes == 0
    assert (tmp_path / "delta").stat().st_size < 0.5 * len(new)


@pytest.mark.parametrize(
    "header",
    [
        b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 999999]}}',  # outside the file
        b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},'
        b' "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}',  # overlapping
        b'{"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}}',
        b'{"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}',  # size != shape
        b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]',  # cut short
        b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "t": {}}',  # twice
        b"[" * 5000,  # deep nesting
    ],
    ids=["outside", "overlap", "absurd", "size", "cut", "duplicate", "deep"],
)
def test_hostile_safetensors_header_is_ignored_safely(tmp_path: Path, header: bytes) -> None:
    """Not a safetensors file, then: diffed without the model, still exact."""
    body = random.Random(5).randbytes(5000)
    old = struct.pack("<Q", len(header)) + header + body
    new = old[:-100] + b"x" * 100
    stats = _basis_round_trip(tmp_path, old, new)
    assert stats.numeric_bytes == 0


def test_absurd_header_length_is_not_allocated(tmp_path: Path) -> None:
    old = struct.pack("<Q", 1 << 62) + b"{" + bytes(1000)
    stats = _basis_round_trip(tmp_path, old, old)
    assert stats.numeric_bytes == 0


# ---------------------------------------------------------------- compatibility


def test_version_1_delta_still_patches(tmp_path: Path) -> None:
    """A delta written by the version 1 engine (committed bytes) patches as before."""
    assert (DATA / "v1.delta").read_bytes()[7] == 1
    native.patch(DATA / "v1.old", DATA / "v1.delta", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == (DATA / "v1.new").read_bytes()
    other = bytearray((DATA / "v1.old").read_bytes())
    other[-1] ^= 1  # version 1 refuses by OLD's whole digest
    (tmp_path / "other").write_bytes(other)
    with pytest.raises(native.WrongBasisError, match="digest differs"):
        native.patch(tmp_path / "other", DATA / "v1.delta", tmp_path / "out2")


def _plane_codecs(delta: bytes) -> set[int]:
    """The codec byte of every plane of every numeric frame (FORMAT.md layout)."""
    codecs, at = set(), 64
    while at < len(delta):
        kind, param = delta[at], delta[at + 2]
        cmd, _, stored = struct.unpack_from("<III", delta, at + 4)
        if kind == 3:
            plane_at = at + 40 + cmd
            for k in range(1 << (param & 3)):
                codecs.add(delta[plane_at])
                plane_at += struct.unpack_from("<I", delta, at + 48 + 4 * k)[0]
        at += 40 + cmd + stored + 8
    return codecs


def test_four_state_rans_delta_still_patches(tmp_path: Path) -> None:
    """A numeric delta of engine 2.0 (committed bytes: planes in the four-state rANS,
    codec 2, zstd and raw) patches as before; today's engine writes codecs 3 and 4 instead."""
    delta = (DATA / "v2rans.delta").read_bytes()
    assert _plane_codecs(delta) == {0, 1, 2}
    native.patch(DATA / "v2rans.old", DATA / "v2rans.delta", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == (DATA / "v2rans.new").read_bytes()
    native.delta_basis(DATA / "v2rans.old", DATA / "v2rans.new", tmp_path / "now.delta")
    assert 2 not in _plane_codecs((tmp_path / "now.delta").read_bytes())
    native.patch(DATA / "v2rans.old", tmp_path / "now.delta", tmp_path / "out2")
    assert (tmp_path / "out2").read_bytes() == (DATA / "v2rans.new").read_bytes()


def test_32_state_rans_delta_still_patches(tmp_path: Path) -> None:
    """A numeric delta of engine 2.2 (committed bytes, v2rans32.delta: every rANS
    plane in the 32-state codec 3) patches as before; today's engine writes the
    64-state codec 4 for the bf16 tensor's 20,000-byte planes and keeps codec 3 for
    the fp32 tensor's 8,000-byte ones, and its delta patches too."""
    old, new = DATA / "v2rans.old", (DATA / "v2rans.new").read_bytes()
    delta = (DATA / "v2rans32.delta").read_bytes()
    assert _plane_codecs(delta) == {0, 1, 3}
    native.patch(old, DATA / "v2rans32.delta", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == new
    native.delta_basis(old, DATA / "v2rans.new", tmp_path / "now.delta")
    now = (tmp_path / "now.delta").read_bytes()
    assert {3, 4} <= _plane_codecs(now)
    # the extra 32 states of each codec-4 plane are all it costs
    assert len(now) <= len(delta) + 128 * 2
    native.patch(old, tmp_path / "now.delta", tmp_path / "out2")
    assert (tmp_path / "out2").read_bytes() == new


def _first_plane_at(delta: bytes, codec: int) -> int:
    at = 64
    while at < len(delta):
        kind, param = delta[at], delta[at + 2]
        cmd, _, stored = struct.unpack_from("<III", delta, at + 4)
        if kind == 3:
            plane_at = at + 40 + cmd
            for k in range(1 << (param & 3)):
                if delta[plane_at] == codec:
                    return plane_at
                plane_at += struct.unpack_from("<I", delta, at + 48 + 4 * k)[0]
        at += 40 + cmd + stored + 8
    raise AssertionError(f"no plane of codec {codec}")


@pytest.mark.parametrize("codec", [3, 4])
def test_damaged_rans_plane_is_one_clear_error(tmp_path: Path, codec: int) -> None:
    """A byte changed inside a rANS plane of either state count fails the patch as a
    corrupt delta (the frame checksum), and writes nothing."""
    native.delta_basis(DATA / "v2rans.old", DATA / "v2rans.new", tmp_path / "d")
    delta = bytearray((tmp_path / "d").read_bytes())
    at = _first_plane_at(bytes(delta), codec)
    for offset in (1, 600, 1000):  # frequencies, states, words
        bad = bytearray(delta)
        bad[at + offset] ^= 0x21
        (tmp_path / "bad").write_bytes(bad)
        with pytest.raises(native.CorruptDeltaError):
            native.patch(DATA / "v2rans.old", tmp_path / "bad", tmp_path / "out")
        assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- streaming patch


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    rng = random.Random(6)
    old = rng.randbytes(3 << 20)
    new = old[:1_000_000] + rng.randbytes(50_000) + old[1_200_000:]
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    native.signature(tmp_path / "old", tmp_path / "sig")
    native.delta(tmp_path / "sig", tmp_path / "new", tmp_path / "delta")
    return tmp_path, new, (tmp_path / "delta").read_bytes()


def _no_spool(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> object:
        raise AssertionError("the delta was spooled to a temporary file")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


def _pieces(data: bytes, size: int = 7000) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_patch_from_chunks_pipe_and_socket_without_spool(
    pair: tuple[Path, bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, new, delta = pair
    _no_spool(monkeypatch)
    native.patch(folder / "old", _pieces(delta), folder / "out1")
    assert (folder / "out1").read_bytes() == new

    rfd, wfd = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(wfd, delta) and None, os.close(wfd)))
    writer.start()
    with os.fdopen(rfd, "rb", buffering=0) as pipe_in:
        native.patch(folder / "old", pipe_in, folder / "out2")
    writer.join(timeout=30)
    assert (folder / "out2").read_bytes() == new

    left, right = socket.socketpair()
    sender = threading.Thread(target=lambda: (left.sendall(delta), left.close()))
    sender.start()
    with right, right.makefile("rb") as sock_in:
        native.patch(folder / "old", sock_in, folder / "out3")
    sender.join(timeout=30)
    assert (folder / "out3").read_bytes() == new


def test_patch_of_a_cut_stream_is_truncated_and_leaves_nothing(
    pair: tuple[Path, bytes, bytes],
) -> None:
    folder, _, delta = pair
    before = listing(folder)
    with pytest.raises(native.TruncatedDeltaError):
        native.patch(folder / "old", _pieces(delta[: len(delta) // 2]), folder / "out")
    assert listing(folder) == before


def test_a_failing_stream_is_reported_as_such(pair: tuple[Path, bytes, bytes]) -> None:
    folder, _, delta = pair

    def broken() -> Iterator[bytes]:
        yield delta[:1000]
        raise ConnectionResetError("peer went away")

    with pytest.raises(native.DeltaIOError, match="peer went away"):
        native.patch(folder / "old", broken(), folder / "out")
    assert not (folder / "out").exists()


def test_delta_chunks_stream_round_trips_and_closes_cleanly(
    pair: tuple[Path, bytes, bytes],
) -> None:
    folder, new, _ = pair
    chunks = native.delta_chunks(folder / "old", folder / "new", basis=True, chunk_size=4096)
    native.patch(folder / "old", chunks, folder / "out")
    assert (folder / "out").read_bytes() == new
    early = native.delta_chunks(folder / "sig", folder / "new", basis=False, chunk_size=64)
    assert next(early)
    early.close()  # cancels and joins the engine thread
    assert not [t for t in threading.enumerate() if t.name.startswith("meridian-delta")]


# ---------------------------------------------------------------- refusals


def test_output_cap_refuses_a_small_delta_that_writes_a_lot(tmp_path: Path) -> None:
    zeros = bytes(1 << 20)
    (tmp_path / "old").write_bytes(zeros)
    (tmp_path / "new").write_bytes(zeros * 64)  # 64 MiB from a delta of a few KiB
    native.signature(tmp_path / "old", tmp_path / "sig")
    native.delta(tmp_path / "sig", tmp_path / "new", tmp_path / "delta")
    assert (tmp_path / "delta").stat().st_size < 64 << 10
    before = listing(tmp_path)
    with pytest.raises(native.OutputTooLargeError, match="more than the 1048576 bytes"):
        native.patch(
            tmp_path / "old", tmp_path / "delta", tmp_path / "out", max_output_size=1 << 20
        )
    assert listing(tmp_path) == before
    with pytest.raises(native.OutputTooLargeError, match="more than the 0 bytes"):
        native.patch(tmp_path / "old", tmp_path / "delta", tmp_path / "out", max_output_size=0)
    native.patch(tmp_path / "old", tmp_path / "delta", tmp_path / "out", max_output_size=64 << 20)
    assert (tmp_path / "out").stat().st_size == 64 << 20


def test_wrong_basis_is_found_in_the_ranges_read_without_hashing_all_of_old(
    pair: tuple[Path, bytes, bytes],
) -> None:
    folder, new, _ = pair
    old = bytearray((folder / "old").read_bytes())
    # a byte that NEW never uses (inside the replaced range): the output is still
    # right and verified, so the patch need not read it at all
    old[1_100_000] ^= 1
    (folder / "unused").write_bytes(old)
    native.patch(folder / "unused", folder / "delta", folder / "out")
    assert (folder / "out").read_bytes() == new
    old[2_000_000] ^= 1  # a byte that is copied
    (folder / "wrong").write_bytes(old)
    with pytest.raises(native.WrongBasisError, match=r"bytes differ within OLD\[\d+, \d+\)"):
        native.patch(folder / "wrong", folder / "delta", folder / "out2")
    assert not (folder / "out2").exists()


def test_old_truncated_during_the_patch_fails_cleanly(tmp_path: Path) -> None:
    """OLD is read with pread: a concurrent truncation is an error, not a SIGBUS."""
    rng = random.Random(9)
    old = rng.randbytes(3 << 20)
    # frame 0: a copy and 1 MiB of literals; frame 1: more literals and a long copy
    new = old[: 1 << 20] + rng.randbytes(3 << 19) + old[1 << 20 :]
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    native.signature(tmp_path / "old", tmp_path / "sig")
    native.delta(tmp_path / "sig", tmp_path / "new", tmp_path / "delta")
    delta = (tmp_path / "delta").read_bytes()
    cmd_len, _, stored = struct.unpack_from("<III", delta, 64 + 4)
    first = 64 + 40 + cmd_len + stored + 8  # the header and frame 0
    applied = threading.Event()

    def progress(done: int) -> None:
        if done >= first:
            applied.set()

    def then_truncate() -> Iterator[bytes]:
        yield delta[:first]
        assert applied.wait(timeout=30), "frame 0 was never applied"
        os.truncate(tmp_path / "old", 1000)
        yield from _pieces(delta[first:])

    with pytest.raises(native.DeltaIOError, match="OLD shrank"):
        native.patch(tmp_path / "old", then_truncate(), tmp_path / "out", progress=progress)
    assert not (tmp_path / "out").exists()


def test_progress_callback_error_joins_the_engine_first(pair: tuple[Path, bytes, bytes]) -> None:
    folder, _, _ = pair

    def boom(done: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        native.delta_basis(
            folder / "old", folder / "new", folder / "d", dtype="fp32", progress=boom
        )
    assert not [t for t in threading.enumerate() if t.name.startswith("meridian-delta")]
    assert not (folder / "d").exists()


def test_threads_beyond_the_engine_are_refused(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(b"x")
    with pytest.raises(InvalidInputError, match="at most 4"):
        native.signature(tmp_path / "old", tmp_path / "sig", threads=5)


# ---------------------------------------------------------------- the CLI


def test_cli_basis_dtype_and_capped_patch_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(8)
    a = _weights(rng, 30_000)
    (tmp_path / "old").write_bytes(_fp32(a))
    (tmp_path / "new").write_bytes(_fp32(_step(a, rng)))
    assert (
        run(
            [
                "delta",
                "diff",
                "--basis",
                *(str(tmp_path / n) for n in ("old", "new", "d")),
                "--dtype",
                "bf16",
            ]
        )
        == 0
    )
    assert (
        run(
            [
                "delta",
                "diff",
                str(tmp_path / "old"),
                str(tmp_path / "new"),
                str(tmp_path / "x"),
                "--dtype",
                "fp32",
            ]
        )
        == 1
    )
    size = str((tmp_path / "new").stat().st_size)
    with (tmp_path / "d").open("rb") as stdin:
        monkeypatch.setattr("sys.stdin", stdin)
        assert (
            run(
                [
                    "delta",
                    "patch",
                    str(tmp_path / "old"),
                    "-",
                    str(tmp_path / "out"),
                    "--max-output-size",
                    size,
                ]
            )
            == 0
        )
    assert (tmp_path / "out").read_bytes() == (tmp_path / "new").read_bytes()
    assert (
        run(
            [
                "delta",
                "patch",
                str(tmp_path / "old"),
                str(tmp_path / "d"),
                str(tmp_path / "o2"),
                "--max-output-size",
                "100",
            ]
        )
        == 1
    )
    assert not (tmp_path / "o2").exists()


def test_cli_module_imports_no_engine_and_agrees_on_threads() -> None:
    """The CLI starts fast: the engine is imported by the commands, not the module."""
    import subprocess
    import sys

    from controlplane.cli import delta as cli_delta

    code = "import sys, controlplane.cli.delta; print('native' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert cli_delta._MAX_THREADS == native.MAX_THREADS


def test_a_patch_counts_its_second_thread_only_when_it_decoded_frames(tmp_path: Path) -> None:
    """`DeltaStats.threads` says what was used: a v2 delta with nothing to decode (its
    frames copy OLD) is patched by one thread whatever `threads` asks; one with zstd
    literals or numeric frames by two."""
    rng = random.Random(11)
    old = rng.randbytes(3_000_000)
    new = old[:1_000_000] + b"x" * 100 + old[1_000_100:]
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    copies = native.delta_basis(tmp_path / "old", tmp_path / "old", tmp_path / "copies")
    literals = native.delta_basis(tmp_path / "old", tmp_path / "new", tmp_path / "literals")
    numeric = native.delta_basis(
        tmp_path / "old", tmp_path / "new", tmp_path / "numeric", dtype="fp32"
    )
    assert (copies.literal_bytes, literals.numeric_bytes, numeric.numeric_bytes > 0) == (0, 0, True)
    for name, used, want in (("copies", 1, old), ("literals", 2, new), ("numeric", 2, new)):
        stats = native.patch(tmp_path / "old", tmp_path / name, tmp_path / f"{name}.out", threads=2)
        assert stats.threads == used, name
        assert (tmp_path / f"{name}.out").read_bytes() == want
