"""Settings of one region controller, and the state its duties share."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.controller.metrics import ControllerMetrics
from controlplane.controller.records import CatalogRecords
from controlplane.coordination.orchestration.failover import MoveTracker
from controlplane.coordination.orchestration.holders import Assessor
from controlplane.coordination.protocols.fencing import FencedResource
from controlplane.policy.current import PolicyView
from controlplane.ports.coordination import Coordination


@dataclass(frozen=True)
class ControllerConfig:
    region: str
    controller_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_ttl_s: int = 5
    reconcile_interval_s: float = 1.0
    canary_interval_s: float = 0.2
    fence_dir: Path | None = None
    # A move whose journal row is still missing this long after it was first seen
    # missing is journaled from its owner record (the mover crashed in between).
    journal_grace_s: float = 15.0
    # How long a stop waits for moves already started to write their journal rows.
    stop_grace_s: float = 10.0
    journal_check_interval_s: float = 5.0
    # How often journal rows deferred by a catalog outage are retried.
    journal_flush_interval_s: float = 0.5
    # Backoff of a duty's loop after an error (doubling from initial to max).
    retry_initial_s: float = 0.1
    retry_max_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Term:
    """One stretch as the region's active controller, under one lease."""

    lease_id: int
    alive_create_revision: int  # the liveness key's, guarded by every claim
    began_at: float  # time.monotonic()
    # The liveness key's mod revision: this term's write of it (a standby taking over
    # overwrites it, keeping its create revision), guarded by every claim too.
    revision: int
    # The liveness key was there, under another lease, when this term wrote it: another
    # controller of this region held the term just before (it gave way; see locks.py).
    took_over: bool = False


@dataclass
class ControllerContext:
    """What the duties of one controller share (built once by the daemon)."""

    coord: Coordination
    config: ControllerConfig
    view: PolicyView
    metrics: ControllerMetrics
    records: CatalogRecords
    moves: MoveTracker
    fence: FencedResource | None
    actor: str
    term: Term | None = None  # set while active
    # What the agents hold, for the failover's choice of target (None: order only).
    holdings: Assessor | None = None

    def retry(self) -> dict[str, float]:
        return {
            "retry_initial_s": self.config.retry_initial_s,
            "retry_max_s": self.config.retry_max_s,
        }
