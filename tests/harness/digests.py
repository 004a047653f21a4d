"""Well-formed content digests for tests that name a version's content by a short tag.

The catalog insists on a known algorithm (`blake3:` and 64 hex digits), so tests
write `fake_digest("a1")` where they once wrote free text; the same tag always gives
the same digest, and different tags different ones."""

from __future__ import annotations

import hashlib


def fake_digest(tag: str) -> str:
    return "blake3:" + hashlib.sha256(tag.encode()).hexdigest()
