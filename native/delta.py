"""The Python front of the native delta engine: paths or binary file objects in,
atomic outputs, and Meridian exceptions out.

Five operations: `signature`, `delta` (against a signature), `delta_basis` (against
OLD itself: numeric deltas for tensors), `patch`, and `delta_chunks` (either delta as
an iterator of bytes chunks, for a gRPC stream). `patch` takes its delta as a path,
a binary file object, a pipe or socket, or an iterable of bytes chunks, and reads it
as it arrives: nothing is spooled to disk.

Guarantees:
- An output given as a path is written to a temporary file beside it, fsynced, then
  renamed into place (and the folder fsynced). On any error neither the output nor
  the temporary exists afterwards.
- An output given as a file object receives the bytes only once the operation
  succeeded.
- Inputs given as file objects are read from their current position to their end.
- The engine runs without the GIL; `progress(done_bytes)` is called from the calling
  thread about ten times a second while it works. If the callback raises, or the
  calling thread is interrupted (Ctrl-C), the engine is told to stop and its thread
  is joined before the exception propagates, so no descriptor it uses is closed
  under it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Final, TypeAlias

from controlplane.errors import InvalidInputError
from native import _delta
from native.errors import (
    CorruptDeltaError,
    CorruptSignatureError,
    DeltaCancelledError,
    DeltaError,
    DeltaIOError,
    OutputTooLargeError,
    TruncatedDeltaError,
    WrongBasisError,
)

Source: TypeAlias = str | os.PathLike[str] | BinaryIO | IO[bytes]
# A delta may also arrive as bytes chunks (a gRPC stream, say).
DeltaSource: TypeAlias = Source | Iterable[bytes]
Progress: TypeAlias = Callable[[int], None]

MIN_BLOCK_SIZE: Final = _delta.MIN_BLOCK_LEN
MAX_BLOCK_SIZE: Final = _delta.MAX_BLOCK_LEN
# The engine works with at most this many threads (its memory bound); more is refused.
MAX_THREADS: Final = _delta.MAX_WORKERS
_POLL_S: Final = 0.1
_PIPE_CHUNK: Final = 1 << 20

# --dtype names and their element sizes: the numeric model only needs the width,
# since it subtracts bit patterns as integers (exact for any value, NaN included).
DTYPE_WIDTHS: Final[dict[str, int]] = {
    "bf16": 2,
    "fp16": 2,
    "f16": 2,
    "fp32": 4,
    "f32": 4,
    "fp64": 8,
    "f64": 8,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
}


@dataclass(frozen=True, slots=True)
class DeltaStats:
    """What one operation read and wrote."""

    input_bytes: int
    output_bytes: int
    copy_bytes: int
    literal_bytes: int
    block_len: int
    strong_len: int
    numeric_bytes: int = 0
    threads: int = 1


def default_block_size(file_size: int) -> int:
    """The block size a signature of a file of `file_size` bytes uses by default."""
    return _delta.default_block_len(file_size)


def _is_path(obj: Source) -> bool:
    return isinstance(obj, str | os.PathLike)


def _name(obj: Source, role: str) -> str:
    if _is_path(obj):
        return os.fspath(obj)  # type: ignore[arg-type]
    name = getattr(obj, "name", None)
    return name if isinstance(name, str) else f"the {role} stream"


def _open_for_reading(path: str, role: str) -> int:
    """`os.open` for reading, its failures worded as one sentence naming the file."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: the {role} file does not exist.") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: the {role} is a folder, not a file.") from None
    except OSError as exc:
        raise DeltaIOError(
            f"{path}: cannot open the {role}: {exc.strerror}.", exc.errno or 0
        ) from exc


@contextlib.contextmanager
def _input_fd(obj: Source, role: str) -> Iterator[int]:
    """A readable, seekable regular-file descriptor for an input, positioned at 0."""
    if _is_path(obj):
        path = os.fspath(obj)  # type: ignore[arg-type]
        fd = _open_for_reading(path, role)
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise InvalidInputError(f"{path}: the {role} is a folder, not a file.")
            if not stat.S_ISREG(mode):
                # pipes and devices: the engine needs a regular file (size, random reads)
                with tempfile.TemporaryFile() as spool, os.fdopen(os.dup(fd), "rb") as src:
                    shutil.copyfileobj(src, spool, 1 << 20)
                    spool.flush()
                    os.lseek(spool.fileno(), 0, os.SEEK_SET)
                    yield spool.fileno()
                return
            yield fd
        finally:
            os.close(fd)
        return
    stream: IO[bytes] = obj  # type: ignore[assignment]
    fileno = _whole_regular_file(stream)
    if fileno is not None:
        # An open regular file at its start: the engine reads it in place (a copy
        # would cost as much I/O as the operation), then the stream is left at its
        # end, as reading it would have left it.
        fd = os.dup(fileno)
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            yield fd
        finally:
            os.close(fd)
            stream.seek(0, os.SEEK_END)
        return
    with tempfile.TemporaryFile() as spool:
        shutil.copyfileobj(stream, spool, 1 << 20)
        spool.flush()
        os.lseek(spool.fileno(), 0, os.SEEK_SET)
        yield spool.fileno()


def _whole_regular_file(stream: IO[bytes]) -> int | None:
    """The descriptor of a plain binary file stream (not, say, a gzip file, whose
    descriptor holds other bytes than it reads) that is a regular file at its start
    (so that "from its current position" means the whole file), else None."""
    if not isinstance(stream, io.FileIO | io.BufferedReader | io.BufferedRandom):
        return None
    try:
        fileno = stream.fileno()
        if not stat.S_ISREG(os.fstat(fileno).st_mode) or stream.tell() != 0:
            return None
        stream.flush()  # a read-write stream's buffered bytes must reach the file
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return None
    return fileno


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race other threads)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _mode_for(dest: Path) -> int:
    """The mode of the file being replaced, else what open(..., 'w') would give."""
    try:
        return stat.S_IMODE(dest.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def _output_fd(obj: Source, role: str, inputs: dict[str, Source] | None = None) -> Iterator[int]:
    """A writable descriptor whose bytes reach `obj` only if the block exits cleanly.

    The output is renamed over its destination, so a destination that is one of the
    inputs, or not a regular file at all (/dev/null, a FIFO), is refused up front:
    renaming over it would destroy an input or replace a device node."""
    if _is_path(obj):
        dest = Path(os.fspath(obj))  # type: ignore[arg-type]
        folder = dest.parent if str(dest.parent) else Path(".")
        if dest.is_dir():
            raise InvalidInputError(f"{dest}: the {role} is a folder, not a file.")
        if dest.exists() and not dest.is_file():
            raise InvalidInputError(
                f"{dest}: the {role} exists and is not a regular file; give a file path."
            )
        for input_role, source in (inputs or {}).items():
            if _is_path(source) and dest.exists() and os.path.samefile(dest, source):  # type: ignore[arg-type]
                raise InvalidInputError(
                    f"{dest}: the {role} is the same file as the {input_role}; write it elsewhere."
                )
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
        except FileNotFoundError:
            raise InvalidInputError(f"{dest}: the folder for the {role} does not exist.") from None
        except OSError as exc:
            raise DeltaIOError(
                f"{dest}: cannot create the {role}: {exc.strerror}.", exc.errno or 0
            ) from exc
        try:
            # mkstemp makes the file 0600; give it what a plain create would get
            os.fchmod(fd, _mode_for(dest))
            yield fd
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, dest)
            tmp = ""
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        finally:
            if fd >= 0:
                os.close(fd)
            if tmp:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return
    stream: IO[bytes] = obj  # type: ignore[assignment]
    with tempfile.TemporaryFile() as spool:
        yield spool.fileno()
        os.lseek(spool.fileno(), 0, os.SEEK_SET)
        try:
            shutil.copyfileobj(spool, stream, 1 << 20)
            stream.flush()
        except OSError as exc:
            where = _name(obj, role)
            raise DeltaIOError(
                f"{where}: cannot write the {role}: {exc.strerror}.", exc.errno or 0
            ) from exc


def _check_threads(threads: int) -> int:
    if not 1 <= threads <= MAX_THREADS:
        raise InvalidInputError(
            f"--threads must be between 1 and {MAX_THREADS} "
            f"(the engine uses at most {MAX_THREADS}), not {threads}."
        )
    return threads


Engine: TypeAlias = "Callable[[bytearray, bytearray], _delta.Stats]"


def _run(call: Engine, progress: Progress | None) -> DeltaStats:
    """Runs the engine on a worker thread while we poll (and report progress, if asked).

    Always on a worker: on the calling thread, a Ctrl-C (or a SIGTERM taken as one) would
    only be seen once the whole output was written. Whatever happens on the calling
    thread (the callback raising, KeyboardInterrupt), the engine is cancelled and its
    thread joined before this returns or raises: the descriptors it works on are closed
    by our callers right after."""
    counter = bytearray(8)
    cancel = bytearray(4)
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["stats"] = call(counter, cancel)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread below
            box["error"] = exc

    worker = threading.Thread(target=work, name="meridian-delta", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(_POLL_S)
            if progress is not None:
                progress(int.from_bytes(counter, "little"))
    except BaseException:
        cancel[:] = (1).to_bytes(4, "little")
        _join_uninterrupted(worker)
        raise
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    stats: _delta.Stats = box["stats"]  # type: ignore[assignment]
    return DeltaStats(**stats)


def _join_uninterrupted(worker: threading.Thread) -> None:
    """Joins a cancelled engine thread (it stops within one frame), even through a
    second Ctrl-C: unwinding before it ends would close descriptors it still uses."""
    while worker.is_alive():
        try:
            worker.join(_POLL_S)
        except KeyboardInterrupt:
            continue


def _translate(exc: _delta.EngineError, where: dict[int, str]) -> DeltaError | InvalidInputError:
    code, message, errno = exc.args
    prefix = where.get(code, "")
    text = f"{prefix}: {message}" if prefix else str(message)
    if code == _delta.E_CORRUPT_SIGNATURE:
        return CorruptSignatureError(text)
    if code == _delta.E_CORRUPT_DELTA:
        return CorruptDeltaError(text)
    if code == _delta.E_TRUNCATED_DELTA:
        return TruncatedDeltaError(text)
    if code == _delta.E_WRONG_BASIS:
        return WrongBasisError(text)
    if code == _delta.E_INVALID:
        return InvalidInputError(text)
    if code == _delta.E_LIMIT:
        return OutputTooLargeError(text)
    if code == _delta.E_CANCELLED:
        return DeltaCancelledError(text)
    return DeltaIOError(text, int(errno))


def signature(
    old: Source,
    sig: Source,
    *,
    threads: int = 1,
    block_size: int | None = None,
    progress: Progress | None = None,
    portable: bool = False,
) -> DeltaStats:
    """Writes the signature of OLD to SIG. `portable` runs the portable code instead
    of the AVX2 kernels (the same bytes; for tests)."""
    _check_threads(threads)
    if block_size is not None and not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidInputError(
            f"--block-size must be between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE} bytes, "
            f"not {block_size}."
        )
    where = {_delta.E_INVALID: _name(old, "OLD"), _delta.E_IO: _name(old, "OLD")}
    with _input_fd(old, "OLD") as ofd, _output_fd(sig, "signature", {"OLD": old}) as sfd:
        try:
            return _run(
                lambda c, x: _delta.signature(
                    ofd, sfd, threads, block_size or 0, c, portable=portable, cancel=x
                ),
                progress,
            )
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def delta(
    sig: Source,
    new: Source,
    out: Source,
    *,
    threads: int = 1,
    progress: Progress | None = None,
    portable: bool = False,
) -> DeltaStats:
    """Writes to OUT the delta that turns the file SIG was made from into NEW."""
    _check_threads(threads)
    where = {_delta.E_CORRUPT_SIGNATURE: _name(sig, "signature"), _delta.E_IO: _name(new, "NEW")}
    with (
        _input_fd(sig, "signature") as sfd,
        _input_fd(new, "NEW") as nfd,
        _output_fd(out, "delta", {"signature": sig, "NEW": new}) as dfd,
    ):
        try:
            return _run(
                lambda c, x: _delta.delta(sfd, nfd, dfd, threads, c, portable=portable, cancel=x),
                progress,
            )
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def element_width(dtype: str | None) -> int:
    """The element size of a --dtype name (0 for None: detect safetensors)."""
    if dtype is None:
        return 0
    try:
        return DTYPE_WIDTHS[dtype.lower()]
    except KeyError:
        names = ", ".join(DTYPE_WIDTHS)
        raise InvalidInputError(f"--dtype must be one of {names}, not {dtype!r}.") from None


def delta_basis(
    old: Source,
    new: Source,
    out: Source,
    *,
    dtype: str | None = None,
    threads: int = 1,
    progress: Progress | None = None,
    portable: bool = False,
) -> DeltaStats:
    """Writes to OUT the delta that turns OLD into NEW, with OLD itself at hand.

    Tensors are diffed as numbers where that writes fewer bytes: safetensors files
    are detected (tensors paired by name), and `dtype` (a key of DTYPE_WIDTHS) states
    one element type for a raw file. Anything else is diffed like `delta`."""
    _check_threads(threads)
    width = element_width(dtype)
    where = {_delta.E_INVALID: _name(new, "NEW"), _delta.E_IO: _name(new, "NEW")}
    with (
        _input_fd(old, "OLD") as ofd,
        _input_fd(new, "NEW") as nfd,
        _output_fd(out, "delta", {"OLD": old, "NEW": new}) as dfd,
    ):
        try:
            return _run(
                lambda c, x: _delta.delta_basis(
                    ofd, nfd, dfd, threads, c, portable=portable, cancel=x, elem_width=width
                ),
                progress,
            )
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def delta_chunks(
    base: Source,
    new: Source,
    *,
    basis: bool,
    dtype: str | None = None,
    threads: int = 1,
    chunk_size: int = _PIPE_CHUNK,
) -> Iterator[bytes]:
    """The delta from BASE (OLD itself with `basis`, else its signature) to NEW, as
    bytes chunks of at most `chunk_size` while the engine makes it (for a stream).

    A failure raises from the iterator after the chunks already yielded: the receiver
    must treat the stream as broken (patch refuses a delta without its END frame).
    Closing the iterator early cancels the engine and joins its thread."""
    _check_threads(threads)
    width = element_width(dtype) if basis else 0
    if not basis and dtype is not None:
        raise InvalidInputError("--dtype needs --basis: a signature carries no numbers.")
    where = {_delta.E_CORRUPT_SIGNATURE: _name(base, "signature"), _delta.E_IO: _name(new, "NEW")}
    with _input_fd(base, "OLD" if basis else "signature") as bfd, _input_fd(new, "NEW") as nfd:
        rfd, wfd = os.pipe()
        cancel = bytearray(4)
        box: dict[str, BaseException] = {}

        def work() -> None:
            try:
                counter = bytearray(8)
                if basis:
                    _delta.delta_basis(
                        bfd, nfd, wfd, threads, counter, cancel=cancel, elem_width=width
                    )
                else:
                    _delta.delta(bfd, nfd, wfd, threads, counter, cancel=cancel)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the iterator
                box["error"] = exc
            finally:
                os.close(wfd)  # the reader sees the end

        worker = threading.Thread(target=work, name="meridian-delta-chunks", daemon=True)
        worker.start()
        try:
            with os.fdopen(rfd, "rb", buffering=0) as reader:
                rfd = -1
                while chunk := reader.read(chunk_size):
                    yield chunk
        finally:
            if worker.is_alive():
                cancel[:] = (1).to_bytes(4, "little")
            if rfd >= 0:
                os.close(rfd)
            _join_uninterrupted(worker)
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, _delta.EngineError):
                raise _translate(exc, where) from None
            raise exc


@contextlib.contextmanager
def _delta_fd(obj: DeltaSource) -> Iterator[int]:
    """A descriptor the engine reads the delta from, front to back, with no spool:
    a regular file or a pipe or socket as it is; anything else (a buffered stream,
    an iterable of chunks) pumped into a pipe by a feeder thread."""
    if isinstance(obj, str | os.PathLike):
        path = os.fspath(obj)
        fd = _open_for_reading(path, "delta")
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise InvalidInputError(f"{path}: the delta is a folder, not a file.")
            yield fd
        finally:
            os.close(fd)
        return
    if isinstance(obj, io.FileIO | io.BufferedReader | io.BufferedRandom):
        whole = _whole_regular_file(obj)
        fileno = whole
        if fileno is None and isinstance(obj, io.FileIO):
            with contextlib.suppress(OSError, ValueError):
                fileno = obj.fileno()  # unbuffered: nothing was read ahead of the descriptor
        if fileno is not None:
            fd = os.dup(fileno)
            try:
                if whole is not None:
                    os.lseek(fd, 0, os.SEEK_SET)
                yield fd
            finally:
                os.close(fd)
                if whole is not None:  # left at its end, as reading it would have left it
                    obj.seek(0, os.SEEK_END)
            return
    chunks = _chunks_of(obj)
    rfd, wfd = os.pipe()
    box: dict[str, BaseException] = {}

    def feed() -> None:
        try:
            with os.fdopen(wfd, "wb", buffering=0) as sink:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[sink.write(view) or 0 :]
        except BrokenPipeError:
            pass  # the engine stopped reading (it failed, or the delta ended): its error counts
        except BaseException as exc:  # noqa: BLE001 - reported on the calling thread
            box["error"] = exc

    feeder = threading.Thread(target=feed, name="meridian-delta-feed", daemon=True)
    feeder.start()
    try:
        yield rfd
    finally:
        os.close(rfd)  # a feeder blocked on a full pipe gets EPIPE and ends
        _join_uninterrupted(feeder)
        if "error" in box:
            # the source's own failure explains the engine's (a truncated delta)
            failure = box["error"]
            raise DeltaIOError(f"reading the delta stream failed: {failure}") from failure


def _chunks_of(obj: DeltaSource) -> Iterator[bytes]:
    read = getattr(obj, "read", None)
    if callable(read):
        while chunk := read(_PIPE_CHUNK):
            yield bytes(chunk)
        return
    for chunk in obj:  # type: ignore[union-attr]
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise InvalidInputError(f"the delta stream yielded {type(chunk).__name__}, not bytes.")
        yield bytes(chunk)


def patch(
    old: Source,
    delta_file: DeltaSource,
    out: Source,
    *,
    threads: int = 1,
    progress: Progress | None = None,
    max_output_size: int | None = None,
    portable: bool = False,
) -> DeltaStats:
    """Writes to OUT the file DELTA describes, verifying OLD and the result by digest.

    DELTA is read once, as it arrives (a path, a file object, a pipe or socket, or an
    iterable of bytes chunks). `max_output_size` refuses a delta that would write more
    bytes (the receiver knows the size it expects)."""
    _check_threads(threads)
    if max_output_size is not None and not 0 <= max_output_size < 1 << 64:
        # The engine takes 64 bits: a larger value would wrap to a tiny cap (or none).
        raise InvalidInputError(
            f"--max-output-size must be from 0 to {(1 << 64) - 1}, not {max_output_size}."
        )
    dname = "the delta stream"
    if isinstance(delta_file, str | os.PathLike) or hasattr(delta_file, "read"):
        dname = _name(delta_file, "delta")  # type: ignore[arg-type]
    where = {
        _delta.E_CORRUPT_DELTA: dname,
        _delta.E_TRUNCATED_DELTA: dname,
        _delta.E_WRONG_BASIS: _name(old, "OLD"),
        _delta.E_INVALID: _name(old, "OLD"),
        _delta.E_IO: _name(out, "output"),
        _delta.E_LIMIT: dname,
    }
    # a cap of 0 bytes is a real cap (an empty file); None is no cap
    cap = max_output_size if max_output_size is not None else 0
    inputs: dict[str, Source] = {"OLD": old}
    if isinstance(delta_file, str | os.PathLike):
        inputs["delta"] = delta_file
    with (
        _input_fd(old, "OLD") as ofd,
        _delta_fd(delta_file) as dfd,
        _output_fd(out, "output", inputs) as wfd,
    ):
        try:
            # a path output is fsynced: let the engine start its writeback early
            durable = _is_path(out)
            if max_output_size == 0:
                return _patch_empty(ofd, dfd, wfd, threads, portable)
            return _run(
                lambda c, x: _delta.patch(
                    ofd,
                    dfd,
                    wfd,
                    threads,
                    c,
                    portable=portable,
                    cancel=x,
                    durable=durable,
                    max_output=cap,
                ),
                progress,
            )
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def _patch_empty(ofd: int, dfd: int, wfd: int, threads: int, portable: bool) -> DeltaStats:
    """A cap of zero bytes: the engine's 0 means "no cap", so allow one byte and
    refuse a result that used it."""
    refusal = "the delta would write more than the 0 bytes the output may have."
    try:
        stats = DeltaStats(**_delta.patch(ofd, dfd, wfd, threads, portable=portable, max_output=1))
    except _delta.EngineError as exc:
        if exc.args[0] == _delta.E_LIMIT:
            raise OutputTooLargeError(refusal) from None
        raise
    if stats.output_bytes:
        raise OutputTooLargeError(refusal)
    return stats
