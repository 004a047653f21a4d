"""HLC text as the catalog stores it: check it, read its wall time, number legacy versions.

The catalog orders versions by the HLC text form of dataplane.md (`controlplane.domain.hlc`),
which sorts as the HLC order byte-wise. Versions registered without an HLC (tools and
tests that name versions `v1`, `v2`) get one from their registration time, strictly
after the newest HLC of their object, so "latest" still means the version registered
last for them — as migration 0004 numbered old rows.
"""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.catalog.errors import CatalogInputError
from controlplane.domain.errors import HLCError
from controlplane.domain.hlc import HLC, LOGICAL_MAX

LEGACY_REGION = "unknown"


def check_hlc(text: str, *, what: str) -> str:
    """`text` if it is HLC text, else one CatalogInputError naming `what`."""
    try:
        return HLC.parse(text).text
    except HLCError as exc:
        raise CatalogInputError(f"{what}: {exc}") from exc


def is_hlc(text: str) -> bool:
    try:
        HLC.parse(text)
    except HLCError:
        return False
    return True


def wall_time(text: str) -> datetime:
    """The physical part of an HLC as a UTC timestamp."""
    return datetime.fromtimestamp(HLC.parse(text).wall_ms / 1000, UTC)


def stamp_after(newest: str | None, at: datetime, region: str | None) -> str:
    """An HLC for a version registered at `at`, strictly above `newest` (if given)."""
    wall, logical = int(at.timestamp() * 1000), 0
    if newest is not None and is_hlc(newest):
        top = HLC.parse(newest)
        if (wall, logical) <= (top.wall_ms, top.logical):
            wall, logical = top.wall_ms, top.logical + 1
            if logical > LOGICAL_MAX:
                wall, logical = wall + 1, 0
    return HLC(wall, logical, region or LEGACY_REGION).text
