"""`rows.to_stored` shares the parse of a row read again, and only of the same row."""

from __future__ import annotations

import pytest

from agents.store import rows
from controlplane.domain.hlc import HLC
from controlplane.domain.version import Digest


def _row(hlc: HLC, state: str = "present", size: int = 3) -> tuple[object, ...]:
    digest = Digest.of(b"abc").text
    return ("ds", "k", hlc.text, "put", size, digest, state, None, 1_796_000_000_000)


def test_a_row_read_again_is_parsed_once_and_a_changed_row_anew() -> None:
    hlc = HLC(1_796_000_000_000, 7, "eu-west")
    first = rows.to_stored(_row(hlc))
    assert rows.to_stored(_row(hlc)) is first  # the same columns: the same parse
    assert (first.key, first.version.hlc, first.state) == ("k", hlc, "present")
    # The same version marked missing by repair is another row: never the old parse.
    missing = rows.to_stored(_row(hlc, state="missing"))
    assert missing.state == "missing" and missing.version == first.version
    assert rows.to_stored(_row(hlc, size=4)).version.size == 4


def test_the_cache_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows, "PARSED_MOST", 3)
    monkeypatch.setattr(rows, "_PARSED", {})
    for n in range(10):
        stored = rows.to_stored(_row(HLC(1_796_000_000_000, n, "eu-west")))
        assert stored.version.hlc.logical == n
        assert len(rows._PARSED) <= 3
