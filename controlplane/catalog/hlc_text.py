"""HLC text as the catalog stores it: check, read the wall time, number legacy versions.

The catalog orders versions by the HLC text form of dataplane.md
(`%013d.%05d@region`), which sorts as the HLC order byte-wise. Versions registered
without an HLC (tools and tests that name versions `v1`, `v2`) get one from their
registration time, strictly after the newest HLC of their object, so "latest" still
means the version registered last for them — as migration 0004 numbers old rows.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from controlplane.catalog.errors import CatalogInputError
from controlplane.catalog.types import HLC_TEXT_LENGTH

HLC_RE = re.compile(r"^(\d{13})\.(\d{5})@([^\x00]{1,63})$")
LEGACY_REGION = "unknown"
LOGICAL_MAX = 99_999


def check_hlc(text: str, *, what: str) -> str:
    """`text` if it is HLC text, else one CatalogInputError naming `what`."""
    if len(text) > HLC_TEXT_LENGTH or not HLC_RE.match(text):
        raise CatalogInputError(
            f"{what} has HLC {text!r}, which is not of the form "
            "WALLMS.LOGICAL@REGION (13 and 5 digits, e.g. 1764579123456.00000@eu-west)"
        )
    return text


def is_hlc(text: str) -> bool:
    return len(text) <= HLC_TEXT_LENGTH and HLC_RE.match(text) is not None


def wall_time(text: str) -> datetime:
    """The physical part of an HLC as a UTC timestamp."""
    return datetime.fromtimestamp(int(text[:13]) / 1000, UTC)


def stamp_after(newest: str | None, at: datetime, region: str | None) -> str:
    """An HLC for a version registered at `at`, strictly above `newest` (if given)."""
    wall, logical = int(at.timestamp() * 1000), 0
    if newest is not None:
        top = HLC_RE.match(newest)
        if top is not None and (wall, logical) <= (int(top[1]), int(top[2])):
            wall, logical = int(top[1]), int(top[2]) + 1
            if logical > LOGICAL_MAX:
                wall, logical = wall + 1, 0
    return f"{wall:013d}.{logical:05d}@{region or LEGACY_REGION}"
