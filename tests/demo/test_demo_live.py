"""The demo's narrative: a live table of the regions on a terminal, structlog lines
elsewhere (no table, nothing on stdout, which holds `--output json`)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from controlplane.demo.live import Narrator, RegionView, _rate


def test_off_a_terminal_each_line_is_one_structlog_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from controlplane.logs import configure_logging

    configure_logging("info", json=True)
    narrator = Narrator(tty=False)
    narrator.say("   ✔ us-east refused the copy")
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert json.loads(line)["event"] == "✔ us-east refused the copy"


def test_the_live_table_shows_owners_epochs_lag_and_rate() -> None:
    narrator = Narrator(tty=True)
    narrator.views = {
        "eu-west": RegionView("eu-west", up="down"),
        "eu-central": RegionView(
            "eu-central", up="controller, agent", owns=["ckpt/demo-run @817"], lag_s=0.4,
            rate=2_500_000,
        ),
    }  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=120).print(narrator.render())
    text = out.getvalue()
    assert "ckpt/demo-run @817" in text
    assert "0.4 s" in text
    assert "2.5 MB/s" in text
    assert "down" in text


def test_rates_read_in_units() -> None:
    assert [_rate(v) for v in (12, 12_300, 4_500_000_000)] == ["12 B/s", "12.3 KB/s", "4.5 GB/s"]
