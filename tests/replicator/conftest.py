"""Fixtures: a replicator wired to in-memory fakes (repl_rig.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import repl_builders as builders
from fakes.replicator import MemoryAgent, MemoryDeadLetters, MemoryLog
from repl_rig import Rig, RigFactory, no_sleep

from controlplane.policy.current import CompiledPolicy
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics


@pytest.fixture
async def rig_factory(tmp_path: Path) -> AsyncIterator[RigFactory]:
    journals: list[RecordJournal] = []

    def make(
        region: str = "eu-central",
        policy: CompiledPolicy | None = None,
        **config: object,
    ) -> Rig:
        cfg = ReplicatorConfig(
            region=region,
            commit_interval_s=0.01,
            poll_timeout_ms=20,
            **config,  # type: ignore[arg-type]
        )
        journal = RecordJournal(tmp_path / f"journal-{len(journals)}.db")
        journals.append(journal)
        agent, log, letters = MemoryAgent(), MemoryLog(), MemoryDeadLetters()
        metrics = ReplicatorMetrics(region)
        current = [policy or builders.policy()]
        applier = Applier(
            cfg,
            agent=agent,
            journal=journal,
            dead_letters=letters,
            policy=lambda: current[0],
            metrics=metrics,
            sleep=no_sleep,
        )
        return Rig(cfg, agent, log, letters, journal, metrics, applier, current)

    yield make
    for j in journals:
        j.close()


@pytest.fixture
def rig(rig_factory: RigFactory) -> Rig:
    return rig_factory()
