"""Edge cases, bad input and the front's guarantees (atomic outputs, file objects,
distinct errors, GIL released, progress)."""

from __future__ import annotations

import gzip
import io
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest
from delta_helpers import listing, round_trip

import native
from controlplane.errors import InvalidInputError, MeridianError

RNG = random.Random(1234)
DATA = RNG.randbytes(3 << 20)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"", b""),
        (b"", b"x"),
        (b"x", b""),
        (b"x", b"x"),
        (b"x", b"y"),
        (DATA[:100], DATA[:100]),
        (DATA[:100], DATA[:99]),
        (DATA[:4096], DATA[:4096]),
        (DATA[:4096], DATA[:4096] + b"tail"),
    ],
    ids=[
        "both-empty",
        "empty-old",
        "empty-new",
        "one-byte",
        "one-byte-changed",
        "under-a-block",
        "under-a-block-shorter",
        "block-multiple",
        "block-multiple-appended",
    ],
)
def test_edge_cases_round_trip(tmp_path: Path, old: bytes, new: bytes) -> None:
    round_trip(tmp_path, old, new, block_size=1024)


def test_identical_files_make_a_tiny_delta(tmp_path: Path) -> None:
    assert len(round_trip(tmp_path, DATA, DATA)) < 1024


def test_identical_zeros_make_a_tiny_delta(tmp_path: Path) -> None:
    zeros = bytes(9 << 20)
    assert len(round_trip(tmp_path, zeros, zeros, threads=2)) < 1024


def test_all_zeros_with_an_edit(tmp_path: Path) -> None:
    zeros = bytearray(2 << 20)
    zeros[777_777:777_790] = b"not a zero!!!"
    delta = round_trip(tmp_path, bytes(2 << 20), bytes(zeros))
    assert len(delta) < 8192


def test_unrelated_files_cost_about_their_size(tmp_path: Path) -> None:
    new = random.Random(5).randbytes(1 << 20)
    delta = round_trip(tmp_path, DATA, new)
    assert len(new) <= len(delta) < len(new) + 1024


def test_an_insertion_costs_at_most_a_block(tmp_path: Path) -> None:
    new = DATA[:1_000_000] + b"inserted" + DATA[1_000_000:]
    block = native.default_block_size(len(DATA))
    assert len(round_trip(tmp_path, DATA, new)) < block + 1024


def test_text_literals_are_compressed(tmp_path: Path) -> None:
    text = b"the quick brown fox jumps over the lazy dog " * 50_000
    delta = round_trip(tmp_path, DATA[:10_000], text)
    assert len(delta) < len(text) // 20


def test_file_objects_in_and_out(tmp_path: Path) -> None:
    old, new = DATA[:500_000], DATA[:200_000] + b"change" + DATA[200_000:500_000]
    sig, dlt, out = io.BytesIO(), io.BytesIO(), io.BytesIO()
    native.signature(io.BytesIO(old), sig)
    native.delta(io.BytesIO(sig.getvalue()), io.BytesIO(new), dlt)
    native.patch(io.BytesIO(old), io.BytesIO(dlt.getvalue()), out)
    assert out.getvalue() == new


def test_open_files_are_read_in_place_or_from_their_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open regular file at its start is read in place (no copy); one at another
    position is read from there; either way the stream ends at its end."""
    old, new = DATA[:500_000], DATA[:200_000] + b"change" + DATA[200_000:500_000]
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(b"skipped" + new)
    front = sys.modules["native.delta"]
    with monkeypatch.context() as m, (tmp_path / "old").open("rb") as fo:
        m.setattr(front.tempfile, "TemporaryFile", None)  # no spool copy may be made
        native.signature(fo, tmp_path / "sig")
        assert fo.tell() == len(old)
    with (tmp_path / "sig").open("rb") as fs, (tmp_path / "new").open("rb") as fn:
        assert fn.read(7) == b"skipped"  # not at its start: read from here on
        native.delta(fs, fn, tmp_path / "delta")
        assert fn.tell() == len(new) + 7
    with (tmp_path / "old").open("rb") as fo, (tmp_path / "delta").open("rb") as fd:
        fo.read(100)
        fo.seek(0)  # back at its start, with bytes in its buffer
        native.patch(fo, fd, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == new


def test_a_compressed_stream_is_read_decompressed(tmp_path: Path) -> None:
    """A gzip file object has the compressed file's descriptor: it must be read
    through the stream, not in place."""
    old = DATA[:300_000]
    (tmp_path / "old").write_bytes(old)
    with gzip.open(tmp_path / "old.gz", "wb") as z:
        z.write(old)
    native.signature(tmp_path / "old", tmp_path / "sig")
    with gzip.open(tmp_path / "old.gz", "rb") as z:
        native.signature(z, tmp_path / "sig-from-gzip")
    assert (tmp_path / "sig-from-gzip").read_bytes() == (tmp_path / "sig").read_bytes()


def _prepare(tmp_path: Path, old: bytes, new: bytes) -> tuple[Path, Path, bytes]:
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    native.signature(tmp_path / "old", tmp_path / "sig", block_size=1024)
    native.delta(tmp_path / "sig", tmp_path / "new", tmp_path / "delta")
    return tmp_path / "old", tmp_path / "delta", (tmp_path / "delta").read_bytes()


def test_corrupt_delta_sample_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    old = DATA[:200_000]
    new = DATA[50_000:120_000] + b"some new text " * 3000 + DATA[:40_000]
    old_path, _, delta = _prepare(tmp_path, old, new)
    before = listing(tmp_path)
    bad = tmp_path / "bad"
    positions = sorted(set(range(0, 100)) | set(random.Random(7).sample(range(len(delta)), 150)))
    for i in positions:
        corrupted = bytearray(delta)
        corrupted[i] ^= 1 << (i % 8)
        bad.write_bytes(corrupted)
        with pytest.raises(native.CorruptDeltaError) as info:
            native.patch(old_path, bad, tmp_path / "out")
        assert "bad: the delta is corrupt" in str(info.value)
        assert listing(tmp_path) == before | {"bad"}


def test_truncated_delta_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    old_path, _, delta = _prepare(tmp_path, DATA[:100_000], DATA[:60_000] + DATA[70_000:100_000])
    before = listing(tmp_path)
    for cut in (0, 10, 63, 64, 100, len(delta) // 2, len(delta) - 1):
        (tmp_path / "cut").write_bytes(delta[:cut])
        with pytest.raises(native.TruncatedDeltaError, match="truncated"):
            native.patch(old_path, tmp_path / "cut", tmp_path / "out")
        assert listing(tmp_path) == before | {"cut"}


def test_wrong_basis_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    _, delta_path, _ = _prepare(tmp_path, DATA[:100_000], DATA[:90_000])
    other = bytearray(DATA[:100_000])
    other[5] ^= 0xFF
    (tmp_path / "other").write_bytes(other)
    before = listing(tmp_path)
    # version 2 names the range of OLD whose bytes differ (version 1: "digest differs")
    with pytest.raises(native.WrongBasisError, match=r"bytes differ within OLD\[0, "):
        native.patch(tmp_path / "other", delta_path, tmp_path / "out")
    (tmp_path / "shorter").write_bytes(DATA[:99_999])
    with pytest.raises(native.WrongBasisError, match="99999 bytes"):
        native.patch(tmp_path / "shorter", delta_path, tmp_path / "out")
    assert listing(tmp_path) == before | {"shorter"}


def test_corrupt_signature_is_refused(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(DATA[:50_000])
    native.signature(tmp_path / "old", tmp_path / "sig", block_size=512)
    sig = bytearray((tmp_path / "sig").read_bytes())
    for i in (0, 9, 20, 70, len(sig) // 2, len(sig) - 1):
        bad = bytearray(sig)
        bad[i] ^= 0x10
        (tmp_path / "bad").write_bytes(bad)
        with pytest.raises(native.CorruptSignatureError):
            native.delta(tmp_path / "bad", tmp_path / "old", tmp_path / "d")
        assert not (tmp_path / "d").exists()
    (tmp_path / "bad").write_bytes(sig[:-3])
    with pytest.raises(native.CorruptSignatureError, match="truncated"):
        native.delta(tmp_path / "bad", tmp_path / "old", tmp_path / "d")


def test_errors_are_meridian_errors_with_exit_1() -> None:
    for cls in (
        native.CorruptDeltaError,
        native.TruncatedDeltaError,
        native.WrongBasisError,
        native.CorruptSignatureError,
    ):
        assert issubclass(cls, InvalidInputError)
        assert cls.exit_code == 1
        assert not cls.retriable
    assert issubclass(native.DeltaIOError, MeridianError)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(b"abc")
    with pytest.raises(InvalidInputError, match="--block-size"):
        native.signature(tmp_path / "old", tmp_path / "sig", block_size=3)
    with pytest.raises(InvalidInputError, match="--threads"):
        native.signature(tmp_path / "old", tmp_path / "sig", threads=0)
    with pytest.raises(InvalidInputError, match="does not exist"):
        native.signature(tmp_path / "missing", tmp_path / "sig")
    with pytest.raises(InvalidInputError, match="folder"):
        native.signature(tmp_path, tmp_path / "sig")
    assert listing(tmp_path) == {"old"}


def test_io_error_on_output(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(DATA[:10_000])
    if not Path("/dev/full").exists():
        pytest.fail("/dev/full is needed to simulate a full disk")
    with open("/dev/full", "wb", buffering=0) as full, pytest.raises(native.DeltaIOError):
        native.signature(tmp_path / "old", full)


def test_the_gil_is_released_and_progress_reported(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        for i in range(24):
            f.write(random.Random(i).randbytes(4 << 20))
    seen: list[int] = []
    ticks = 0
    done = threading.Event()

    def work() -> None:
        native.signature(big, tmp_path / "sig", progress=seen.append)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        ticks += 1
        time.sleep(0)
    t.join(60)
    assert done.is_set()
    # Held through the engine's run, the GIL would let this thread run at most a tick
    # or two; released, it runs thousands, or a few dozen when the machine is loaded
    # and the engine fast (it failed at > 100 on 2 shared cores).
    assert ticks > 10, "the calling thread could not run while the engine worked"
    assert seen == sorted(seen)
    assert seen and seen[-1] <= big.stat().st_size


def test_output_replaces_an_existing_file_atomically(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(b"previous")
    round_trip(tmp_path, DATA[:10_000], DATA[:5_000])
    assert (tmp_path / "out").read_bytes() == DATA[:5_000]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_output_gets_the_usual_file_mode(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(b"abc")
    native.signature(tmp_path / "old", tmp_path / "sig")
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "sig").stat().st_mode & 0o777 == 0o666 & ~umask
    os.chmod(tmp_path / "sig", 0o640)
    native.signature(tmp_path / "old", tmp_path / "sig")
    assert (tmp_path / "sig").stat().st_mode & 0o777 == 0o640
