"""Each structured log line reaches the stream in one write, newline included: the
chaos checkers read the daemons' JSON lines back, and a line split across two writes
let another thread's stderr message land inside it."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from controlplane.logs import LineLogger, configure_logging, get_logger


class Recording(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def test_a_line_and_its_newline_are_one_write() -> None:
    out = Recording()
    LineLogger(file=out).info('{"event": "x"}')
    LineLogger(file=out).error("second")
    assert out.writes == ['{"event": "x"}\n', "second\n"]


def test_the_configured_logger_writes_whole_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Recording()
    monkeypatch.setattr("sys.stderr", out)
    saved = structlog.get_config()
    try:
        configure_logging("info", json=True)
        get_logger("meridian.test").info("event_applied", event_id="e1", outcome="applied")
    finally:
        structlog.configure(**saved)
    (line,) = out.writes
    assert line.endswith("\n")
    record = json.loads(line)
    assert (record["event"], record["event_id"], record["outcome"]) == (
        "event_applied",
        "e1",
        "applied",
    )
