"""The invariant checkers: pure functions over a run's history and final state.

Each module holds one invariant, its `NAME` (as `chaos list` shows it) and a
`check(...)` returning a `Verdict`.
"""

from chaos.checkers.verdict import Verdict

__all__ = ["Verdict"]
