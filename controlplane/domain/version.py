"""Object versions, content digests and the last-writer-wins rule (spec/dataplane.md).

- `Digest(algorithm, hex)`, written `blake3:<hex>`: the content digest, computed
  once at the origin when the bytes are written (`Digest.of`, `ContentHasher`).
  `Digest.parse` refuses an unknown algorithm, bad hex or a wrong length, each
  with one `DigestError`. Hex is lower case, so one digest has one text.
- `Version(hlc, op, size, digest)`: `op` is `put` (with the digest and size of
  its content) or `delete`, a tombstone (size 0, no digest) that takes part in
  ordering like any version.
- `lww(incoming, held)`: THE comparison of versions. Every component that decides
  whether a version replaces another calls it, so all regions converge on the
  same newest version whatever the arrival order.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from controlplane.domain.errors import DigestError, VersionError
from controlplane.domain.hlc import HLC

if TYPE_CHECKING:
    import blake3

Op = Literal["put", "delete"]
OPS: tuple[str, ...] = get_args(Op)

# Algorithm -> digest length in bytes. Only blake3 names content today.
ALGORITHMS: dict[str, int] = {"blake3": 32}
CONTENT_ALGORITHM = "blake3"
_HEX_RE = re.compile(r"[0-9a-f]*")


@dataclass(frozen=True)
class Digest:
    """A content digest and the algorithm that made it."""

    algorithm: str
    hex: str

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise DigestError(
                f"digest algorithm {self.algorithm!r} is not known "
                f"(known: {', '.join(sorted(ALGORITHMS))})"
            )
        if not isinstance(self.hex, str) or _HEX_RE.fullmatch(self.hex) is None:
            raise DigestError(f"{self.algorithm} digest {self.hex!r} is not lower-case hexadecimal")
        want = 2 * ALGORITHMS[self.algorithm]
        if len(self.hex) != want:
            raise DigestError(f"{self.algorithm} digest has {len(self.hex)} hex digits, not {want}")

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def text(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, text: object) -> Digest:
        """Read `<algorithm>:<hex>`; one DigestError says what is wrong."""
        if not isinstance(text, str):
            raise DigestError(f"digest must be a string, got {type(text).__name__}")
        algorithm, colon, hex_ = text.partition(":")
        if not colon:
            raise DigestError(
                f"digest {text!r} names no algorithm; expected <algorithm>:<hex>, "
                "such as blake3:<64 hex digits>"
            )
        return cls(algorithm, hex_)

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> Digest:
        """The content digest of `data`."""
        hasher = ContentHasher()
        hasher.update(data)
        return hasher.digest()


class ContentHasher:
    """Incremental content digest, for bytes that arrive in chunks."""

    def __init__(self) -> None:
        # Imported here: commands that never hash should not load the extension.
        from blake3 import blake3 as new_hasher

        self._hasher: blake3.blake3 = new_hasher()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._hasher.update(data)

    def digest(self) -> Digest:
        return Digest(CONTENT_ALGORITHM, self._hasher.hexdigest())


@dataclass(frozen=True)
class Version:
    """One version of an object: a put of `size` bytes with `digest`, or a tombstone."""

    hlc: HLC
    op: Op
    size: int
    digest: Digest | None

    def __post_init__(self) -> None:
        if not isinstance(self.hlc, HLC):
            raise VersionError(f"version hlc must be an HLC, got {self.hlc!r}")
        if self.op not in OPS:
            raise VersionError(f"version op must be one of {', '.join(OPS)}, got {self.op!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise VersionError(f"version size must be an integer >= 0, got {self.size!r}")
        if self.op == "put" and not isinstance(self.digest, Digest):
            raise VersionError(f"a put version needs its content digest, got {self.digest!r}")
        if self.op == "delete" and (self.digest is not None or self.size != 0):
            raise VersionError(
                f"a delete version (tombstone) has no content: size 0 and no digest, "
                f"got size {self.size} and digest {self.digest}"
            )

    @property
    def is_tombstone(self) -> bool:
        return self.op == "delete"

    @classmethod
    def put(cls, hlc: HLC, size: int, digest: Digest) -> Version:
        return cls(hlc, "put", size, digest)

    @classmethod
    def delete(cls, hlc: HLC) -> Version:
        return cls(hlc, "delete", 0, None)


class Verdict(enum.Enum):
    """What `lww` decides about an incoming version."""

    APPLY = "apply"  # its HLC is greater than the held version's (or nothing is held)
    SAME = "same"  # the held version itself (a replay): a no-op
    COLLISION = "collision"  # equal HLC but other content: a no-op, worth counting
    OLDER = "older"  # superseded by the held version: a no-op

    @property
    def applies(self) -> bool:
        return self is Verdict.APPLY


def lww(incoming: Version, held: Version | None) -> Verdict:
    """Last writer wins: apply `incoming` only if its HLC is strictly greater than that
    of `held`, the newest version held of the object (put or tombstone; None when
    there is none). An equal HLC is a no-op, so replays are idempotent. Pure."""
    if held is None or incoming.hlc > held.hlc:
        return Verdict.APPLY
    if incoming.hlc < held.hlc:
        return Verdict.OLDER
    return Verdict.SAME if incoming == held else Verdict.COLLISION


def newest(versions: Iterable[Version]) -> Version | None:
    """The version every region converges on: the one `lww` lets win over all others."""
    best: Version | None = None
    for version in versions:
        if lww(version, best).applies:
            best = version
    return best
