"""Unit tests of the shared `--since` parser (history and audit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.cli.since import MAX_DAYS, parse_since
from controlplane.errors import InvalidInputError

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_durations_and_rfc3339_times_are_both_accepted() -> None:
    assert parse_since(None) is None
    assert parse_since("90s", now=NOW) == NOW - timedelta(seconds=90)
    assert parse_since("2w", now=NOW) == NOW - timedelta(days=14)
    assert parse_since(f"{MAX_DAYS}d", now=NOW) == NOW - timedelta(days=MAX_DAYS)
    assert parse_since("2026-11-29T00:00:00Z") == datetime(2026, 11, 29, tzinfo=UTC)
    assert parse_since("2026-11-29T01:00:00+01:00") == datetime(2026, 11, 29, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("99999999999d", "more than 36500 days"),
        (f"{MAX_DAYS + 1}d", "more than 36500 days"),
        ("1" * 400 + "s", "more than 36500 days"),
        ("0001-01-01T00:00:00+01:00", "out of range"),
        ("2026-11-29T00:00:00", "neither"),
        ("5 days", "neither"),
        ("", "neither"),
    ],
)
def test_bad_values_are_one_sentence(text: str, needle: str) -> None:
    with pytest.raises(InvalidInputError, match=needle) as info:
        parse_since(text, now=NOW)
    assert str(info.value).startswith(f"--since {text!r}")
