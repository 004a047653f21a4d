"""Shared topology and placements of the coordination tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from waiting import WaitTimeoutError, until

from controlplane.coordination.catalog_glue.sources import PlacementSource, RegionInfo
from controlplane.coordination.timeutil import utcnow
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy
from controlplane.policy.publisher import CoordinationPolicyPublisher
from controlplane.ports.coordination import Coordination

REGIONS = [
    RegionInfo("eu-west", "EU"),
    RegionInfo("eu-central", "EU"),
    RegionInfo("eu-north", "EU"),
    RegionInfo("us-east", "US"),
]


def critical(
    name: str,
    home: str = "eu-west",
    order: tuple[str, ...] = ("eu-central", "eu-north"),
    mode: str = "automatic",
) -> Placement:
    return Placement(
        dataset=name,
        policy="checkpoints",
        dataset_class="critical",
        home=home,
        replicas=order,
        residency=("EU",),
        rpo_s=0,
        failover_mode=mode,  # type: ignore[arg-type]
        failover_order=order,
    )


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout_s: float, step_s: float = 0.05
) -> bool:
    """Whether `pred` comes true within `timeout_s` (waiting.until, as a bool for the
    `assert await wait_until(...)` of the callers)."""
    try:
        return bool(await until(pred, timeout_s, "the condition", step_s=step_s))
    except WaitTimeoutError:
        return False


def compiled_world(source: PlacementSource, revision: int = 1) -> CompiledPolicy:
    """A compiled policy holding exactly these regions and placements (no rules, so
    no dataset beyond them is placed)."""
    regions = {r.name: r.jurisdiction for r in source.regions()}
    placements = {p.dataset: p for p in source.placements()}
    rules = {
        "topology": "test",
        "regions": {n: {"jurisdiction": j} for n, j in regions.items()},
        "links": {},
        "policies": {},
        "datasets": {},
    }
    return CompiledPolicy(
        digest=f"test-{revision}",
        revision=revision,
        applied_at=utcnow(),
        regions=regions,
        links={},
        placements=placements,
        rules=rules,
    )


async def publish_world(coord: Coordination, source: PlacementSource) -> CompiledPolicy:
    """Publish `source` to /meridian/policy/current, as `policy apply` would."""
    policy = compiled_world(source)
    await CoordinationPolicyPublisher(coord).publish(policy)
    return policy
