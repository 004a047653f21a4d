"""Typed stubs of the CPython binding `native._delta` (see native/python/_deltamodule.c)."""

from typing import TypedDict

from _typeshed import WriteableBuffer

class Stats(TypedDict):
    input_bytes: int
    output_bytes: int
    copy_bytes: int
    literal_bytes: int
    numeric_bytes: int
    block_len: int
    strong_len: int
    threads: int

class EngineError(Exception):
    """args: (code, message, errno)."""

E_IO: int
E_CORRUPT_SIGNATURE: int
E_CORRUPT_DELTA: int
E_TRUNCATED_DELTA: int
E_WRONG_BASIS: int
E_INVALID: int
E_NOMEM: int
E_LIMIT: int
E_CANCELLED: int
MAX_WORKERS: int
MIN_BLOCK_LEN: int
MAX_BLOCK_LEN: int

def signature(
    old_fd: int,
    sig_fd: int,
    threads: int = 1,
    block_len: int = 0,
    progress: WriteableBuffer | None = None,
    portable: bool = False,
    cancel: WriteableBuffer | None = None,
) -> Stats: ...
def delta(
    sig_fd: int,
    new_fd: int,
    delta_fd: int,
    threads: int = 1,
    progress: WriteableBuffer | None = None,
    portable: bool = False,
    cancel: WriteableBuffer | None = None,
) -> Stats: ...
def delta_basis(
    old_fd: int,
    new_fd: int,
    delta_fd: int,
    threads: int = 1,
    progress: WriteableBuffer | None = None,
    portable: bool = False,
    cancel: WriteableBuffer | None = None,
    elem_width: int = 0,
) -> Stats: ...
def patch(
    old_fd: int,
    delta_fd: int,
    out_fd: int,
    threads: int = 1,
    progress: WriteableBuffer | None = None,
    portable: bool = False,
    cancel: WriteableBuffer | None = None,
    durable: bool = False,
    max_output: int = 0,
) -> Stats: ...
def default_block_len(size: int, /) -> int: ...
