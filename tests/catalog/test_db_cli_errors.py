"""`meridian db` refuses unusable catalogs with one sentence (no internal error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.cli.main import run


@pytest.mark.parametrize("command", ["current", "upgrade"])
def test_a_file_that_is_not_a_database(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "catalog.db"
    bogus.write_text("not sqlite\n")
    assert run(["db", command, "--catalog", f"sqlite:///{bogus}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the catalog at ") and "cannot be read" in err
    assert err.count("\n") == 1
    assert bogus.read_text() == "not sqlite\n"


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///:memory:"])
def test_an_in_memory_catalog_is_refused(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["db", "upgrade", "--catalog", url]) == 1
    assert "in-memory SQLite database" in capsys.readouterr().err
