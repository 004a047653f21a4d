"""A replicator wired to in-memory fakes: agent, change log, dead letters (the fixtures
in conftest.py build it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import repl_builders as builders
from fakes.replicator import MemoryAgent, MemoryDeadLetters, MemoryLog

from controlplane.domain.events import ChangeEvent
from controlplane.policy.current import CompiledPolicy
from replicator.applier import Applier
from replicator.config import ReplicatorConfig
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.service import ReplicatorLoop


async def no_sleep(_s: float) -> None:
    return None


@dataclass
class Rig:
    config: ReplicatorConfig
    agent: MemoryAgent
    log: MemoryLog
    letters: MemoryDeadLetters
    journal: RecordJournal
    metrics: ReplicatorMetrics
    applier: Applier
    current: list[CompiledPolicy] = field(default_factory=list)

    def publish(self, *events: ChangeEvent) -> None:
        for e in events:
            self.log.append(builders.log_key(e), builders.value(e))

    def loop(self) -> ReplicatorLoop:
        async def flush() -> None:
            self.journal.flush()

        return ReplicatorLoop(
            self.config,
            self.log,
            self.applier,
            self.metrics,
            assigned_by_rebalance=False,
            before_commit=flush,
        )

    def metric(self, name: str, **labels: str) -> float:
        got = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if got is None else got


RigFactory = Callable[..., Rig]
