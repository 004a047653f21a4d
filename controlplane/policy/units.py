"""Parsing of the units of spec/policy.md: durations, bandwidths, names, jurisdictions."""

from __future__ import annotations

import re

# The number and its unit are written together (`12ms`, `500MiB/s`), as in the spec;
# these patterns are also the JSON Schema's, so editors and `validate` agree.
DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
BANDWIDTH_RE = re.compile(r"^(\d+(?:\.\d+)?)(B/s|KiB/s|MiB/s|GiB/s|KB/s|MB/s|GB/s|Kbps|Mbps|Gbps)$")
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
    match = DURATION_RE.match(text)
    if match is None:
        raise ValueError(
            f"malformed duration {text!r}: use a number with ms, s, m or h, such as 30s"
        )
    return float(match.group(1)) * _SECONDS[match.group(2)]


def parse_bandwidth_bps(text: str) -> float:
    """`500MiB/s` -> bytes per second; raise ValueError naming the accepted units."""
    match = BANDWIDTH_RE.match(text)
    if match is None:
        raise ValueError(
            f"malformed bandwidth {text!r}: use a number with B/s, KiB/s, MiB/s, GiB/s, "
            "KB/s, MB/s, GB/s, Kbps, Mbps or Gbps, such as 500MiB/s"
        )
    value = float(match.group(1)) * _BYTES_PER_S[match.group(2)]
    if value <= 0:
        raise ValueError(f"bandwidth {text!r} must be greater than 0")
    return value


def check_region_name(text: str) -> str:
    if REGION_RE.match(text) is None:
        raise ValueError(
            f"malformed region name {text!r}: use lower case letters, digits and '-', "
            "starting with a letter, at most 63 characters"
        )
    return text


def check_jurisdiction(text: str) -> str:
    if JURISDICTION_RE.match(text) is None:
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
