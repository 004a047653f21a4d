"""The tests' harness (tests/harness), made importable by the benchmarks that share it.

The benchmarks run as plain scripts (`python benchmarks/x.py`), so tests/ is not on
their path; the harness stays out of the installed packages (it starts processes and
throwaway databases, which production code must never do).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from harness.catalogs import scratch_catalog  # noqa: E402
from harness.controllers import ControllerProcess, prepare_catalog  # noqa: E402
from harness.invariants import epoch_violations, split_brain  # noqa: E402

__all__ = [
    "ControllerProcess",
    "epoch_violations",
    "prepare_catalog",
    "scratch_catalog",
    "split_brain",
]
