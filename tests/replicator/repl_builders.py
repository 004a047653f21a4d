"""Hand-made policies, events and records for the replicator's tests."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import UTC, datetime

from controlplane.domain.events import ChangeEvent
from controlplane.domain.hlc import HLC, system_ms
from controlplane.domain.placement import Placement
from controlplane.domain.version import Digest, Version
from controlplane.policy.current import CompiledPolicy, Link
from controlplane.ports.changelog import Record
from meridian.convert import encode_change_event

REGIONS = {"eu-west": "EU", "eu-central": "EU", "us-east": "US"}
_ids = itertools.count(1)


def placement(
    dataset: str = "corpus/web",
    *,
    home: str = "eu-west",
    replicas: tuple[str, ...] = ("eu-central",),
    residency: tuple[str, ...] = ("EU",),
    deletes: str = "replicate",
) -> Placement:
    return Placement(
        dataset=dataset,
        policy="corpus",
        dataset_class="standard",
        home=home,
        replicas=replicas,
        residency=residency,
        rpo_s=60.0,
        failover_mode="manual",
        failover_order=(),
        deletes=deletes,  # type: ignore[arg-type]
    )


def policy(
    *placements: Placement,
    rtt: dict[tuple[str, str], float] | None = None,
    revision: int = 3,
) -> CompiledPolicy:
    links = {
        frozenset(pair): Link(frozenset(pair), seconds, None)
        for pair, seconds in (rtt or {}).items()
    }
    return CompiledPolicy(
        digest="sha256:test",
        revision=revision,
        applied_at=datetime.now(UTC),
        regions=dict(REGIONS),
        links=links,
        placements={p.dataset: p for p in placements or (placement(),)},
        rules={"regions": {name: {"jurisdiction": j} for name, j in REGIONS.items()}},
    )


def put(
    key: str,
    data: bytes = b"hello",
    *,
    wall_ms: int | None = None,
    logical: int = 0,
    origin: str = "eu-west",
    dataset: str = "corpus/web",
    inline: bool = True,
    event_id: str | None = None,
    policy_revision: int = 3,
) -> ChangeEvent:
    hlc = HLC(wall_ms if wall_ms is not None else system_ms(), logical, origin)
    return ChangeEvent(
        event_id=event_id or f"ev-{next(_ids)}",
        dataset=dataset,
        key=key,
        version=Version.put(hlc, len(data), Digest.of(data)),
        origin_region=origin,
        policy_revision=policy_revision,
        inline=data if inline else None,
        origin_agent=None if inline else f"{origin}.agent:7000",
    )


def delete(
    key: str,
    *,
    wall_ms: int | None = None,
    logical: int = 0,
    origin: str = "eu-west",
    dataset: str = "corpus/web",
) -> ChangeEvent:
    hlc = HLC(wall_ms if wall_ms is not None else system_ms(), logical, origin)
    return ChangeEvent(
        event_id=f"ev-{next(_ids)}",
        dataset=dataset,
        key=key,
        version=Version.delete(hlc),
        origin_region=origin,
        policy_revision=3,
    )


def value(event: ChangeEvent) -> bytes:
    return encode_change_event(event)


def log_key(event: ChangeEvent) -> bytes:
    return event.log_key.encode()


async def until(
    cond: asyncio.Condition, predicate: Callable[[], bool], timeout_s: float = 5
) -> None:
    """Wait, bounded, until `predicate` holds; `cond` is notified when it may have changed."""
    async with asyncio.timeout(timeout_s), cond:
        await cond.wait_for(predicate)


def rec_of(event: ChangeEvent, offset: int = 0) -> Record:
    """The Kafka record that carries `event`."""
    return Record("meridian.changes", 0, offset, log_key(event), value(event))
