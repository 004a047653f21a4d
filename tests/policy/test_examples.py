"""The example policies users copy (examples/policies/) are valid, through the CLI's door."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness.controllers import meridian_argv

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "policies").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/policies/ holds no policy"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_validates_with_no_problem(path: Path) -> None:
    done = subprocess.run(
        [*meridian_argv(), "policy", "validate", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == []
