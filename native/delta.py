"""The Python front of the native delta engine: paths or binary file objects in,
atomic outputs, and Meridian exceptions out.

Guarantees:
- An output given as a path is written to a temporary file beside it, fsynced, then
  renamed into place (and the folder fsynced). On any error neither the output nor
  the temporary exists afterwards.
- An output given as a file object receives the bytes only once the operation
  succeeded.
- Inputs given as file objects are read from their current position to their end.
- The engine runs without the GIL; `progress(done_bytes)` is called from the calling
  thread about ten times a second while it works.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Final, TypeAlias

from controlplane.errors import InvalidInputError
from native import _delta
from native.errors import (
    CorruptDeltaError,
    CorruptSignatureError,
    DeltaError,
    DeltaIOError,
    TruncatedDeltaError,
    WrongBasisError,
)

Source: TypeAlias = str | os.PathLike[str] | BinaryIO | IO[bytes]
Progress: TypeAlias = Callable[[int], None]

MIN_BLOCK_SIZE: Final = _delta.MIN_BLOCK_LEN
MAX_BLOCK_SIZE: Final = _delta.MAX_BLOCK_LEN
MAX_THREADS: Final = 64
_POLL_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class DeltaStats:
    """What one operation read and wrote."""

    input_bytes: int
    output_bytes: int
    copy_bytes: int
    literal_bytes: int
    block_len: int
    strong_len: int


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


@contextlib.contextmanager
def _input_fd(obj: Source, role: str) -> Iterator[int]:
    """A readable, seekable regular-file descriptor for an input, positioned at 0."""
    if _is_path(obj):
        path = os.fspath(obj)  # type: ignore[arg-type]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInputError(f"{path}: the {role} file does not exist.") from None
        except IsADirectoryError:
            raise InvalidInputError(f"{path}: the {role} is a folder, not a file.") from None
        except OSError as exc:
            raise DeltaIOError(
                f"{path}: cannot open the {role}: {exc.strerror}.", exc.errno or 0
            ) from exc
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
        raise InvalidInputError(f"--threads must be between 1 and {MAX_THREADS}, not {threads}.")
    return threads


def _run(call: Callable[[bytearray], _delta.Stats], progress: Progress | None) -> DeltaStats:
    """Runs the engine; with a progress callback, on a worker thread while we poll."""
    counter = bytearray(8)
    if progress is None:
        return DeltaStats(**call(counter))
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["stats"] = call(counter)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread below
            box["error"] = exc

    worker = threading.Thread(target=work, name="meridian-delta", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(_POLL_S)
        progress(int.from_bytes(counter, "little"))
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    stats: _delta.Stats = box["stats"]  # type: ignore[assignment]
    return DeltaStats(**stats)


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
    return DeltaIOError(text, int(errno))


def signature(
    old: Source,
    sig: Source,
    *,
    threads: int = 1,
    block_size: int | None = None,
    progress: Progress | None = None,
) -> DeltaStats:
    """Writes the signature of OLD to SIG."""
    _check_threads(threads)
    if block_size is not None and not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidInputError(
            f"--block-size must be between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE} bytes, "
            f"not {block_size}."
        )
    where = {_delta.E_INVALID: _name(old, "OLD"), _delta.E_IO: _name(old, "OLD")}
    with _input_fd(old, "OLD") as ofd, _output_fd(sig, "signature", {"OLD": old}) as sfd:
        try:
            return _run(lambda c: _delta.signature(ofd, sfd, threads, block_size or 0, c), progress)
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def delta(
    sig: Source,
    new: Source,
    out: Source,
    *,
    threads: int = 1,
    progress: Progress | None = None,
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
            return _run(lambda c: _delta.delta(sfd, nfd, dfd, threads, c), progress)
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None


def patch(
    old: Source,
    delta_file: Source,
    out: Source,
    *,
    threads: int = 1,
    progress: Progress | None = None,
) -> DeltaStats:
    """Writes to OUT the file DELTA describes, verifying OLD and the result by digest."""
    _check_threads(threads)
    dname = _name(delta_file, "delta")
    where = {
        _delta.E_CORRUPT_DELTA: dname,
        _delta.E_TRUNCATED_DELTA: dname,
        _delta.E_WRONG_BASIS: _name(old, "OLD"),
        _delta.E_INVALID: _name(old, "OLD"),
        _delta.E_IO: _name(out, "output"),
    }
    with (
        _input_fd(old, "OLD") as ofd,
        _input_fd(delta_file, "delta") as dfd,
        _output_fd(out, "output", {"OLD": old, "delta": delta_file}) as wfd,
    ):
        try:
            # a path output is fsynced: let the engine start its writeback early
            durable = _is_path(out)
            return _run(lambda c: _delta.patch(ofd, dfd, wfd, threads, c, durable), progress)
        except _delta.EngineError as exc:
            raise _translate(exc, where) from None
