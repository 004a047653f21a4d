"""Parsing of the units of spec/policy.md: durations, bandwidths, names, jurisdictions."""

from __future__ import annotations

import math
import re

# The number and its unit are written together (`12ms`, `500MiB/s`), as in the spec;
# these patterns are also the JSON Schema's, so editors and `validate` agree. Hence
# `[0-9]`, not `\d` (any Unicode digit to Python, `٠` or `５`), and the patterns are
# only ever used with `fullmatch`: Python's `$` also matches before a final newline,
# which a JSON Schema's (ECMA-262) `$` does not.
DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)$")
BANDWIDTH_RE = re.compile(
    r"^([0-9]+(?:\.[0-9]+)?)(B/s|KiB/s|MiB/s|GiB/s|KB/s|MB/s|GB/s|Kbps|Mbps|Gbps)$"
)
# A bandwidth must be > 0: the same pattern, with a non-zero digit required (the units
# hold no digits, so the lookahead can only find it in the number).
BANDWIDTH_SCHEMA_PATTERN = "^(?=[^1-9]*[1-9])" + BANDWIDTH_RE.pattern.removeprefix("^")
REGION_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
JURISDICTION_RE = re.compile(r"^[A-Z]{2,8}$")

_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_BYTES_PER_S = {
    "B/s": 1.0,
    "KiB/s": 1024.0,
    "MiB/s": 1024.0**2,
    "GiB/s": 1024.0**3,
    "KB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
    "Kbps": 1e3 / 8,
    "Mbps": 1e6 / 8,
    "Gbps": 1e9 / 8,
}


def parse_duration_s(text: str) -> float:
    """`12ms` -> 0.012; raise ValueError naming the accepted forms."""
    seconds = _amount(DURATION_RE, _SECONDS, text)
    if seconds is None:
        raise ValueError(
            f"malformed duration {text!r}: use a number with ms, s, m or h, such as 30s"
        )
    return _finite("duration", text, seconds)


def parse_bandwidth_bps(text: str) -> float:
    """`500MiB/s` -> bytes per second; raise ValueError naming the accepted units."""
    value = _amount(BANDWIDTH_RE, _BYTES_PER_S, text)
    if value is None:
        raise ValueError(
            f"malformed bandwidth {text!r}: use a number with B/s, KiB/s, MiB/s, GiB/s, "
            "KB/s, MB/s, GB/s, Kbps, Mbps or Gbps, such as 500MiB/s"
        )
    if _finite("bandwidth", text, value) <= 0:
        raise ValueError(f"bandwidth {text!r} must be greater than 0")
    return value


def _amount(pattern: re.Pattern[str], factors: dict[str, float], text: str) -> float | None:
    match = pattern.fullmatch(text)
    return None if match is None else float(match.group(1)) * factors[match.group(2)]


def _finite(kind: str, text: str, value: float) -> float:
    # Over ~309 digits a float is infinite, and would be stored as "infs".
    if not math.isfinite(value):
        shown = repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"
        raise ValueError(f"{kind} {shown} is too large")
    return value


def parse_policy_duration_s(text: str) -> float:
    """`parse_duration_s`, also refusing a duration that its stored form would change."""
    seconds = parse_duration_s(text)
    stored = format_duration(seconds)
    _check_stored("duration", text, seconds, stored, _amount(DURATION_RE, _SECONDS, stored))
    return seconds


def parse_policy_bandwidth_bps(text: str) -> float:
    """`parse_bandwidth_bps`, also refusing a bandwidth that its stored form would change."""
    value = parse_bandwidth_bps(text)
    stored = format_bandwidth(value)
    _check_stored("bandwidth", text, value, stored, _amount(BANDWIDTH_RE, _BYTES_PER_S, stored))
    return value


# Two floats closer than this (relatively) are one value: a unit's factor leaves a
# last-digit error (1.1h is 3960.0000000000005s, stored as 3960s), a user's digit more.
_SAME_VALUE = 1e-9


def _check_stored(kind: str, text: str, value: float, stored: str, again: float | None) -> None:
    """A revision stores `stored`, and plan, apply and the placer read that back: a value
    it would change (a standard rpo of 0.0000000001s becoming 0ms, which the placer then
    refuses) is refused here, where the user can still see which one it is."""
    if value > 0 and not again:
        raise ValueError(f"{kind} {text!r} is too small to store: it would be stored as {stored!r}")
    if again is None or abs(again - value) > _SAME_VALUE * value:
        raise ValueError(
            f"{kind} {text!r} is more precise than a policy keeps: it would be stored as {stored!r}"
        )


def check_region_name(text: str) -> str:
    if REGION_RE.fullmatch(text) is None:
        raise ValueError(
            f"malformed region name {text!r}: use lower case letters, digits and '-', "
            "starting with a letter, at most 63 characters"
        )
    return text


def check_jurisdiction(text: str) -> str:
    if JURISDICTION_RE.fullmatch(text) is None:
        raise ValueError(f"malformed jurisdiction {text!r}: use 2 to 8 upper case letters")
    return text


def _plain(number: float) -> str:
    # Never an exponent: the parsers above accept only plain decimals.
    return format(number, "f").rstrip("0").rstrip(".") or "0"


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{_plain(round(seconds * 1000, 6))}ms"
    return f"{_plain(seconds)}s"


def format_bandwidth(bytes_per_s: float) -> str:
    return f"{_plain(bytes_per_s)}B/s"
