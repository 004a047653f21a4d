"""A failover watch whose term just followed an etcd outage leaves a region's liveness
deletion to the sweep (chaos scenario 6: after a quorum loss every region writes its
liveness key again, and the first back must not fail the others over)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane.controller.config import Term
from controlplane.controller.failover_watch import FailoverWatch
from controlplane.coordination.protocols import keys
from controlplane.ports.coordination import EventType, KeyValue, WatchEvent


class OneDeletion:
    """A coordination port whose watch delivers the deletion of eu-central's key."""

    async def revision(self) -> int:
        return 1

    async def watch(self, key: str, *, prefix: bool, start_revision: int) -> AsyncIterator[Any]:
        kv = KeyValue(keys.alive("eu-central"), b"", 1, 2, 0)
        yield WatchEvent(EventType.DELETE, kv, 2)


class Recorder(FailoverWatch):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed_over: list[str] = []

    async def fail_over(
        self, region: str, *, detected_at_monotonic: float, quiet: bool = False
    ) -> int:
        self.failed_over.append(region)
        return 0


def watch(*, recovering: bool, age_s: float) -> Recorder:
    config = SimpleNamespace(
        region="eu-west", lease_ttl_s=2.0, retry_initial_s=0.1, retry_max_s=1.0
    )
    ctx: Any = SimpleNamespace(
        coord=OneDeletion(),
        config=config,
        retry=lambda: {"retry_initial_s": 0.1, "retry_max_s": 1.0},
    )
    term = Term(lease_id=1, alive_create_revision=1, began_at=time.monotonic() - age_s, revision=1)
    return Recorder(ctx, term, recovering=recovering)


@pytest.mark.parametrize(
    ("recovering", "age_s", "moved"),
    [(True, 0.1, []), (False, 0.1, ["eu-central"]), (True, 5.0, ["eu-central"])],
    ids=["just-after-an-outage", "first-term", "an-old-term"],
)
async def test_a_deletion_early_in_a_term_after_an_outage_waits_for_the_sweep(
    recovering: bool, age_s: float, moved: list[str]
) -> None:
    w = watch(recovering=recovering, age_s=age_s)
    await w._watch_regions()
    assert w.failed_over == moved
