"""Errors of the domain contracts: bad input met at a boundary, and clock skew.

Each is one sentence naming the field (or the text) that was wrong. They subclass
the project's tree (`controlplane.errors`), so the CLI edge and the gRPC adapters
map them like any other input error.
"""

from __future__ import annotations

from controlplane.errors import InvalidInputError, RefusedError


class DomainInputError(InvalidInputError, ValueError):
    """A domain value given as JSON, text or a protobuf message is malformed.

    Also a ValueError, so parsers used as pydantic validators report it as one."""


class PlacementError(DomainInputError):
    """A placement (JSON or constructor arguments) is malformed or inconsistent."""


class HLCError(DomainInputError):
    """An HLC timestamp is malformed (bad text, negative or too large counter, bad region)."""


class DigestError(DomainInputError):
    """A content digest names no known algorithm, or its hex is malformed or of the wrong length."""


class VersionError(DomainInputError):
    """A version is malformed (unknown op, negative size, a tombstone with content)."""


class ObjectNameError(DomainInputError):
    """A dataset or object name could escape a store's root or is not valid text."""


class MessageError(DomainInputError):
    """A message at the wire boundary misses a required field, holds a bad one, or
    cannot be decoded. `field` is the dotted path of the field (empty when the
    whole message is at fault)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class ClockSkewError(RefusedError):
    """A received timestamp is further ahead of the local physical clock than allowed.

    Not retriable as it is: the version goes to the dead-letter topic with reason
    `clock skew` (spec/dataplane.md)."""

    reason = "clock skew"

    def __init__(self, message: str, *, ahead_ms: int, max_skew_ms: int) -> None:
        super().__init__(message)
        self.ahead_ms = ahead_ms
        self.max_skew_ms = max_skew_ms
