"""What a checker returns: held or not, one line of detail, and the offending items."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_DETAIL_ITEMS = 5


@dataclass(frozen=True)
class Verdict:
    name: str
    held: bool
    detail: str | None
    offending: Sequence[str] = field(default_factory=tuple)

    @classmethod
    def of(cls, name: str, problems: Sequence[str], ok_detail: str | None = None) -> Verdict:
        """Held when there is no problem; else the first few problems as the detail."""
        if not problems:
            return cls(name, True, ok_detail, ())
        shown = "; ".join(problems[:MAX_DETAIL_ITEMS])
        more = len(problems) - MAX_DETAIL_ITEMS
        suffix = f"; and {more} more" if more > 0 else ""
        return cls(name, False, f"{len(problems)} violation(s): {shown}{suffix}", tuple(problems))

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "held": self.held, "detail": self.detail}
