"""`--since`, shared by `meridian history` and `meridian audit ...`: one parser, one message.

Accepts a duration back from now (`90s`, `30m`, `12h`, `7d`, `2w`; at most
`MAX_DAYS` days, so the start is always a representable time) or an RFC 3339 time
with a zone (`2026-11-29T00:00:00Z`). Anything else is one clear sentence.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from controlplane.errors import InvalidInputError

MAX_DAYS = 36_500  # a hundred years: older than any journal, far from datetime's limits
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_FORMS = "a duration (30m, 12h, 7d) or an RFC 3339 time with a zone (2026-11-29T00:00:00Z)"


def parse_since(text: str | None, *, now: datetime | None = None) -> datetime | None:
    """`7d` -> now - 7 days; an RFC 3339 time as is (in UTC); None -> None."""
    if text is None:
        return None
    given = text.strip()
    match = _DURATION.match(given)
    if match:
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        if seconds > MAX_DAYS * 86400:
            raise InvalidInputError(
                f"--since {text!r} reaches back more than {MAX_DAYS} days; give a shorter "
                "duration or an RFC 3339 time"
            )
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        stamp = datetime.fromisoformat(given.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        stamp = None
    if stamp is None or stamp.tzinfo is None:
        raise InvalidInputError(f"--since {text!r} is neither {_FORMS}")
    try:
        return stamp.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 has no UTC equivalent
        raise InvalidInputError(f"--since {text!r} is out of range; {_FORMS}") from None
