"""Run several scenarios on one private stack (brought up once, stopped after)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from chaos.runner import Result, groups, run_group
from chaos.scenarios import BY_NAME, SCENARIOS, Scenario
from chaos.stack import PrivateStack
from controlplane.errors import InvalidInputError
from controlplane.settings import Settings

MIN_DURATION_S = 10.0


def pick(names: Sequence[str]) -> list[Scenario]:
    """Scenarios by name or issue number, in the order given; all when none is."""
    if not names:
        return list(SCENARIOS)
    by_number = {str(s.number): s for s in SCENARIOS}
    out = []
    for name in names:
        found = BY_NAME.get(name) or by_number.get(name)
        if found is None:
            known = ", ".join(f"{s.name} ({s.number})" for s in SCENARIOS)
            raise InvalidInputError(f"no chaos scenario named {name!r}; known: {known}")
        out.append(found)
    return out


def run_suite(
    base: Settings,
    scenarios: Sequence[Scenario],
    seed: int,
    duration_s: float,
    announce: Callable[[str], None] = lambda _: None,
    *,
    shared: bool = True,
) -> list[Result]:
    """`shared`: consecutive scenarios of one world kind run on one world (False: a
    fresh world each, slower, for isolating a failure)."""
    if duration_s < MIN_DURATION_S:
        raise InvalidInputError(
            f"--duration {duration_s:g}s is too short: faults need at least "
            f"{MIN_DURATION_S:g}s to outlast a lease"
        )
    stack = PrivateStack(base)
    runs_dir = stack.settings.home / "runs"
    announce(f"chaos: private stack under {stack.run_dir} (starting it if needed)")
    stack.up()
    results: list[Result] = []
    try:
        # Consecutive scenarios needing the same kind of world share one (chaos.runner).
        for group in groups(scenarios) if shared else [[i] for i in range(len(scenarios))]:
            chosen = [scenarios[i] for i in group]
            seeds = [seed + i for i in group]
            results += asyncio.run(
                run_group(stack, chosen, seeds, duration_s, runs_dir, announce=announce)
            )
    finally:
        stack.down()
    return results
