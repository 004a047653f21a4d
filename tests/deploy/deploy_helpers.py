"""Helpers of the deployment tests: paths, and running a tool bounded in time."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# A command that takes longer is hung: fail it rather than wait for the test timeout.
TOOL_TIMEOUT_S = 300


def run_tool(
    argv: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = TOOL_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run a tool, bounded in time; the caller asserts on the result."""
    return subprocess.run(
        [str(part) for part in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"`{' '.join(done.args)}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
