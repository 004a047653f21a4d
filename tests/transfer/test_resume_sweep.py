"""Resume states of cut transfers expire periodically (not only at start), in bounded
passes that spare the pulls in flight."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agents.transfer.resume import MAX_AGE_S, ResumeBook, ResumeState
from agents.transfer.sweep import ResumeSweeper

WAIT_S = 10.0


def cut(book: ResumeBook, key: str, *, age_s: float) -> None:
    """A cut raw transfer of ds/key: a state and the partial bytes it names."""
    book.partial_path("ds", key, "1.00000@eu-west").write_bytes(b"partial")
    book.save(
        ResumeState(
            transfer_id=f"t-{key}",
            dataset="ds",
            key=key,
            hlc="1.00000@eu-west",
            method="raw",
            basis_hlc="",
            offset=7,
            received=7,
            created_s=time.time() - age_s,
        )
    )


def held(book: ResumeBook) -> list[str]:
    return sorted(key for key in "abcdefgh" if book.load("ds", key, "1.00000@eu-west") is not None)


def test_expiry_is_bounded_per_pass_and_spares_pulls_in_flight(tmp_path: Path) -> None:
    book = ResumeBook(tmp_path)
    for key in "abcde":
        cut(book, key, age_s=MAX_AGE_S + 60)
    cut(book, "f", age_s=10)  # young: kept
    # A first attempt in flight has its partial file before its first state.
    book.partial_path("ds", "g", "1.00000@eu-west").write_bytes(b"arriving")
    # The delta engine's output of a pull in flight, as it patches (a dot first).
    stem = book.partial_path("ds", "a", "1.00000@eu-west").name.split(".", 1)[0]
    patching = book.folder / f".{stem}.out.x1y2z3.tmp"
    patching.write_bytes(b"patched so far")
    with book.in_flight("ds", "a", "1.00000@eu-west"), book.in_flight("ds", "g", "1.00000@eu-west"):
        removed = book.expire(limit=2)
        assert removed == 2 and len(held(book)) == 4
        assert book.expire(limit=10) == 2  # the rest but the one in flight
        assert held(book) == ["a", "f"]
        assert book.partial_path("ds", "g", "1.00000@eu-west").exists()
        assert patching.exists()
    assert book.expire() == 1  # no longer in flight: it goes too
    assert held(book) == ["f"]
    assert not book.partial_path("ds", "g", "1.00000@eu-west").exists()  # no state: gone
    assert not patching.exists()  # its pull ended: the sweep takes what it left
    assert sorted(p.name.split(".", 1)[1] for p in book.folder.iterdir()) == ["json", "part"]


async def test_the_sweeper_expires_states_while_the_agent_runs(tmp_path: Path) -> None:
    book = ResumeBook(tmp_path)
    sweeper = ResumeSweeper(book, interval_s=0.05, max_age_s=3600, max_per_pass=2)
    async with sweeper:
        for key in "abc":
            cut(book, key, age_s=7200)  # cut after the start's expiry
        cut(book, "d", age_s=60)
        await asyncio.wait_for(sweeper.wait_passes(2), WAIT_S)
        assert held(book) == ["d"]  # two passes of at most two each
    passes = sweeper.passes
    assert not sweeper.running and sweeper.passes == passes


def test_an_eviction_drops_the_partial_pulls_of_what_it_forgot(tmp_path: Path) -> None:
    """`dataset evict` forgot ds/a..c at 1.00000@eu-west: their partial bytes go too, except
    a pull in flight, a newer version's pull, another key's and another dataset's."""
    book = ResumeBook(tmp_path)
    for key in "abcd":
        cut(book, key, age_s=10)
    newer = "2.00000@eu-west"
    book.partial_path("ds", "a", newer).write_bytes(b"newer")
    book.save(ResumeState("t-new", "ds", "a", newer, "raw", "", 5, 5, time.time()))
    book.partial_path("other", "a", "1.00000@eu-west").write_bytes(b"other")
    book.save(ResumeState("t-oth", "other", "a", "1.00000@eu-west", "raw", "", 5, 5, time.time()))
    forgot = {k: "1.00000@eu-west" for k in "abc"}
    with book.in_flight("ds", "c", "1.00000@eu-west"):
        assert book.drop_evicted("ds", forgot) == 2
    assert held(book) == ["c", "d"]
    assert not book.partial_path("ds", "a", "1.00000@eu-west").exists()
    assert book.load("ds", "a", newer) is not None and book.partial_path("ds", "a", newer).exists()
    assert book.load("other", "a", "1.00000@eu-west") is not None
    assert book.drop_evicted("ds", forgot) == 1  # c, no longer in flight
    assert held(book) == ["d"]
