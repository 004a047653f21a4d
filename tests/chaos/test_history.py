"""The history recorder: pairing, outcomes, one clock, and a faithful save/load."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.history import Event, History


def test_operations_pair_invokes_with_completions_in_invoke_order() -> None:
    h = History()
    a = h.invoke("c/0", "write", "eu-west", "ds", "k", digest="d1")
    b = h.invoke("c/1", "write", "eu-west", "ds", "k", digest="d2")
    h.complete(b, "fail", error="refused")
    h.complete(a, "ok", version="v1")
    h.invoke("c/2", "write", "eu-west", "ds", "k")  # never completed
    ops = h.operations()
    assert [op.outcome for op in ops] == ["ok", "fail", "info"]
    assert ops[0].seen("version") == "v1"
    assert ops[0].seen("digest") == "d1"  # from the invoke when the completion lacks it
    times = [e.time_ns for e in h.events]
    assert times == sorted(times)
    assert len({e.op_id for e in h.events}) == 3


def test_a_completion_needs_an_open_operation() -> None:
    h = History()
    a = h.invoke("c/0", "write", "eu-west", "ds", "k")
    h.complete(a, "ok")
    with pytest.raises(ValueError, match="not open"):
        h.complete(a, "ok")
    b = h.invoke("c/0", "write", "eu-west", "ds", "k")
    with pytest.raises(ValueError, match="ok, fail or info"):
        h.complete(b, "invoke")
    with pytest.raises(ValueError, match="already open"):
        h.invoke("c/0", "write", "eu-west", "ds", "k", op_id=b.op_id)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    h = History()
    a = h.invoke("c/0", "write", "eu-west", "ds", "k", digest="d")
    h.complete(a, "info", error="timeout")
    h.save(tmp_path / "h.jsonl")
    loaded = History.load(tmp_path / "h.jsonl")
    assert loaded.events == h.events
    assert loaded.operations()[0].outcome == "info"


def test_a_malformed_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    good = Event(0, 1, "c/0", "invoke", "write", "x", "eu-west", "ds").as_json()
    bad = {**good, "index": 1, "type": "maybe"}
    import json

    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"h\.jsonl:2.*maybe"):
        History.load(path)
