"""A failover watch whose term followed an earlier one (an etcd outage) leaves a region's
liveness deletion to the sweep while the term settles, and the sweep moves only a region
it has seen dead for a TTL and a second (chaos scenario 6: after a quorum loss every
region writes its liveness key again, and the first back must not fail the others
over)."""

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
    [
        (True, 0.1, []),
        (True, 5.0, []),  # past a TTL and a second: expiries of the outage still come
        (False, 0.1, ["eu-central"]),
        (True, 6.5, ["eu-central"]),
    ],
    ids=["just-after-an-outage", "still-settling", "first-term", "a-settled-term"],
)
async def test_a_deletion_early_in_a_term_after_an_outage_waits_for_the_sweep(
    recovering: bool, age_s: float, moved: list[str]
) -> None:
    w = watch(recovering=recovering, age_s=age_s)
    await w._watch_regions()
    assert w.failed_over == moved


def test_after_an_outage_the_sweep_moves_only_a_region_dead_for_a_ttl_and_a_second() -> None:
    w = watch(recovering=True, age_s=10.0)  # TTL 2: dead for 3 s in a row
    assert w.confirmed_dead({"eu-central", "eu-west"}, now=100.0) == []  # eu-west is us
    assert w.confirmed_dead({"eu-central", "us-east"}, now=102.9) == []
    assert w.confirmed_dead({"eu-central", "us-east"}, now=103.0) == ["eu-central"]
    assert w.confirmed_dead({"us-east"}, now=104.0) == []  # eu-central came back
    assert w.confirmed_dead({"eu-central", "us-east"}, now=105.0) == []  # so it starts over
    assert w.confirmed_dead({"eu-central", "us-east"}, now=106.0) == ["us-east"]


def test_in_a_first_term_the_sweep_moves_a_dead_region_at_once() -> None:
    w = watch(recovering=False, age_s=10.0)
    assert w.confirmed_dead({"eu-central", "eu-west"}, now=100.0) == ["eu-central"]
