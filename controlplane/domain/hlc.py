"""Hybrid logical clock timestamps and the per-process clock (spec/dataplane.md).

`HLC(wall_ms, logical, region)` orders every version of an object the same way
in every region: by `wall_ms`, then `logical`, then `region` byte-wise. Its text
form `%013d.%05d@%s` (e.g. `1764579123456.00000@eu-west`) sorts as a string in
the same order, because both numbers have a fixed width and a region name is
ASCII (lower case letters, digits and `-`, as spec/policy.md names regions).
`HLC.parse` accepts exactly that form and nothing else.

`HybridClock` is the one clock of a process: `now()` stamps a local event and
never goes backwards; `observe(remote)` merges a received stamp so that every
later `now()` is greater than it, after refusing (`ClockSkewError`) a stamp whose
`wall_ms` is more than `max_clock_skew_ms` ahead of the physical clock. When the
logical counter would pass 99999 within one millisecond the clock moves to the
next millisecond instead, so the text form never needs a sixth digit. The
physical clock is injectable for tests; calls are thread-safe.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.domain.errors import ClockSkewError, HLCError

WALL_MS_MAX = 10**13 - 1  # 13 digits: the year 2286
LOGICAL_MAX = 10**5 - 1
DEFAULT_MAX_CLOCK_SKEW_MS = 1000

# [0-9], not \d: \d would also take other scripts' digits.
REGION_PATTERN = r"[a-z][a-z0-9-]{0,62}"
_REGION_RE = re.compile(REGION_PATTERN)
_TEXT_RE = re.compile(rf"([0-9]{{13}})\.([0-9]{{5}})@({REGION_PATTERN})")
EXAMPLE_TEXT = "1764579123456.00000@eu-west"


@dataclass(frozen=True, order=True)
class HLC:
    """One timestamp. Field order is the comparison order; `region` compares by code
    point, which for the ASCII names allowed is byte-wise."""

    wall_ms: int
    logical: int
    region: str

    def __post_init__(self) -> None:
        for name, value, top in (
            ("wall_ms", self.wall_ms, WALL_MS_MAX),
            ("logical", self.logical, LOGICAL_MAX),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise HLCError(f"HLC {name} must be an integer, got {value!r}")
            if not 0 <= value <= top:
                raise HLCError(f"HLC {name} must be between 0 and {top}, got {value}")
        if not isinstance(self.region, str) or _REGION_RE.fullmatch(self.region) is None:
            raise HLCError(
                f"HLC region {self.region!r} is not a region name (lower case letters, "
                "digits and '-', starting with a letter, at most 63 characters)"
            )

    def __str__(self) -> str:
        return f"{self.wall_ms:013d}.{self.logical:05d}@{self.region}"

    @property
    def text(self) -> str:
        return str(self)

    @classmethod
    def _trusted(cls, wall_ms: int, logical: int, region: str) -> HLC:
        """An HLC from fields already known valid (matched text, the clock's own state),
        without checking them again: stamps are made on every write and every apply."""
        stamp = object.__new__(cls)
        object.__setattr__(stamp, "wall_ms", wall_ms)
        object.__setattr__(stamp, "logical", logical)
        object.__setattr__(stamp, "region", region)
        return stamp

    @classmethod
    def parse(cls, text: object) -> HLC:
        """Read the text form; anything else gets one HLCError saying what is wrong."""
        if not isinstance(text, str):
            raise HLCError(f"HLC text must be a string, got {type(text).__name__}")
        match = _TEXT_RE.fullmatch(text)
        if match is None:
            raise HLCError(f"malformed HLC {text!r}: {_diagnose(text)}")
        # The pattern admits exactly the valid fields (13 and 5 digits, a region name).
        return cls._trusted(int(match.group(1)), int(match.group(2)), match.group(3))


def _diagnose(text: str) -> str:
    form = f"expected 13 digits, '.', 5 digits, '@' and a region, as in {EXAMPLE_TEXT}"
    stamp, at, region = text.partition("@")
    if not at:
        return f"no '@region' part; {form}"
    wall, dot, logical = stamp.partition(".")
    if not dot:
        return f"no '.' between wall_ms and logical; {form}"
    if not (len(wall) == 13 and wall.isascii() and wall.isdigit()):
        return f"wall_ms {wall!r} is not 13 digits; {form}"
    if not (len(logical) == 5 and logical.isascii() and logical.isdigit()):
        return f"logical {logical!r} is not 5 digits; {form}"
    return f"region {region!r} is not a region name; {form}"


def system_ms() -> int:
    """Physical time: milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def offset_ms(offset: int) -> Callable[[], int]:
    """The physical clock shifted by `offset` ms (setting `clock_offset_ms`): how a
    skewed region is made without changing the machine's clock."""
    if offset == 0:
        return system_ms
    return lambda: system_ms() + offset


class HybridClock:
    """The clock of one process in `region` (see the module docstring)."""

    def __init__(
        self,
        region: str,
        *,
        max_clock_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS,
        physical_ms: Callable[[], int] = system_ms,
    ) -> None:
        if isinstance(max_clock_skew_ms, bool) or not isinstance(max_clock_skew_ms, int):
            raise HLCError(f"max_clock_skew_ms must be an integer, got {max_clock_skew_ms!r}")
        if max_clock_skew_ms < 0:
            raise HLCError(f"max_clock_skew_ms must be >= 0, got {max_clock_skew_ms}")
        self.region = HLC(0, 0, region).region  # validates the name
        self.max_clock_skew_ms = max_clock_skew_ms
        self._physical_ms = physical_ms
        self._lock = threading.Lock()
        self._wall_ms = 0
        self._logical = 0

    @property
    def last(self) -> HLC:
        """The newest stamp this clock has issued or observed (0.00000 at first)."""
        with self._lock:
            return HLC._trusted(self._wall_ms, self._logical, self.region)

    def _physical(self) -> int:
        ms = self._physical_ms()
        if isinstance(ms, bool) or not isinstance(ms, int):
            raise HLCError(f"the physical clock gave {ms!r}, not integer milliseconds")
        return ms

    def now(self) -> HLC:
        """A stamp for a local event, greater than every stamp issued or observed so far."""
        with self._lock:
            physical = self._physical()
            if physical > self._wall_ms:
                self._advance(physical, 0)
            else:
                self._advance(self._wall_ms, self._logical + 1)
            return HLC._trusted(self._wall_ms, self._logical, self.region)

    def advance_past(self, stamp: HLC) -> None:
        """Never issue a stamp at or below `stamp` again: what a store opened with holds
        (a restarted process, its physical clock stepped back since). No skew check:
        these stamps were issued or accepted before."""
        with self._lock:
            if (stamp.wall_ms, stamp.logical) > (self._wall_ms, self._logical):
                self._advance(stamp.wall_ms, stamp.logical)

    def check_skew(self, remote: HLC) -> None:
        """Raise ClockSkewError if `remote` is too far ahead of the physical clock."""
        self._check_skew(remote, self._physical())

    def observe(self, remote: HLC) -> HLC:
        """Merge a received stamp (after the skew check, which leaves the clock as it was
        when it refuses); return a local stamp greater than both `remote` and every
        stamp this clock issued before."""
        with self._lock:
            physical = self._physical()
            self._check_skew(remote, physical)
            wall = max(self._wall_ms, remote.wall_ms, physical)
            if wall == self._wall_ms == remote.wall_ms:
                logical = max(self._logical, remote.logical) + 1
            elif wall == self._wall_ms:
                logical = self._logical + 1
            elif wall == remote.wall_ms:
                logical = remote.logical + 1
            else:
                logical = 0
            self._advance(wall, logical)
            return HLC._trusted(self._wall_ms, self._logical, self.region)

    def _check_skew(self, remote: HLC, physical: int) -> None:
        ahead = remote.wall_ms - physical
        if ahead > self.max_clock_skew_ms:
            raise ClockSkewError(
                f"HLC {remote} is {ahead} ms ahead of this clock in {self.region} "
                f"(max_clock_skew_ms is {self.max_clock_skew_ms}); it is not applied",
                ahead_ms=ahead,
                max_skew_ms=self.max_clock_skew_ms,
            )

    def _advance(self, wall: int, logical: int) -> None:
        # Called with the lock held. A full counter borrows the next millisecond.
        if logical > LOGICAL_MAX:
            wall, logical = wall + 1, 0
        if not 0 <= wall <= WALL_MS_MAX:
            raise HLCError(f"HLC wall_ms {wall} is out of range; the physical clock is wrong")
        self._wall_ms, self._logical = wall, logical
