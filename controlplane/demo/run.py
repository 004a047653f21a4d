"""Run the demo: the local stack, three regions, the story, the table of checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from controlplane.demo.steps import SCALES, Check, Story
from controlplane.demo.world import World
from controlplane.errors import StackError
from controlplane.settings import Settings

REGIONS = {"eu-west": "EU", "eu-central": "EU", "us-east": "US"}
# The links of examples/policies/training.yaml, put on the wire by Toxiproxy.
RTT_MS = {
    frozenset(("eu-west", "eu-central")): 8,
    frozenset(("eu-west", "us-east")): 80,
    frozenset(("eu-central", "us-east")): 90,
}
POLICY = Path(__file__).parents[2] / "examples" / "policies" / "training.yaml"


def _reset_shared_state(settings: Settings, world: World) -> None:
    """The demo owns the local stack's Meridian state: clear etcd's `/meridian/` keys and
    start every region's change-log consumer from now."""
    from controlplane.adapters.etcd import EtcdCoordination
    from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaAdmin, fast_forward_group

    async def reset() -> None:
        async with EtcdCoordination(
            [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
        ) as coord:
            await coord.delete("/meridian/", prefix=True)
        async with KafkaAdmin(settings.kafka_bootstrap) as admin:
            await admin.ensure_topics([CHANGES_TOPIC])
        for region in world.regions:
            await fast_forward_group(
                settings.kafka_bootstrap, f"meridian-replicator-{region}", CHANGES_TOPIC.name
            )

    asyncio.run(reset())


def run_demo(
    settings: Settings, *, keep: bool, scale: str, say: Callable[[str], None] = print
) -> list[Check]:
    from controlplane.stack.manager import Stack

    plan = SCALES[scale]
    started = time.monotonic()
    say("Starting the local stack (etcd, Kafka, Toxiproxy) if it is not up…")
    Stack(settings).up(progress=lambda line: say(f"   {line}"))
    run_dir = settings.home / "demo" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    world = World(
        run_dir,
        regions=REGIONS,
        rtt_ms=RTT_MS,
        etcd=settings.etcd,
        kafka=settings.kafka,
        toxiproxy=settings.toxiproxy,
    )
    story = Story(world, plan, run_dir / "work", say)
    (run_dir / "work").mkdir()
    try:
        _reset_shared_state(settings, world)
        for args in (("db", "upgrade"), ("policy", "apply", str(POLICY), "--yes")):
            done = world.cli(*args)
            if done.returncode != 0:
                raise StackError(f"`meridian {' '.join(args)}` failed: {done.stderr.strip()}")
        say(f"Applied {POLICY.name}: checkpoints critical in the EU, the corpus in the EU and US.")
        world.make_links()
        for region in REGIONS:
            world.start_region(region)
        say(f"Three regions up ({', '.join(REGIONS)}), logs in {run_dir / 'logs'}.")
        for step in (
            story.checkpoints_step,
            story.corpus_step,
            story.residency_step,
            story.failover_step,
            story.return_step,
            story.audit_step,
        ):
            try:
                step()
            except StackError as exc:
                story.check(step.__name__.removesuffix("_step"), "the step ran", False, str(exc))
        say(f"Done in {time.monotonic() - started:.0f} s.")
        if keep:
            _explore(world, say)
        return story.checks
    finally:
        if not keep:
            world.stop()


def _explore(world: World, say: Callable[[str], None]) -> None:
    say("Left running (--keep). Try, with the demo's settings:")
    for key, value in world.env().items():
        say(f"   export {key}={value}")
    west = world.regions["eu-west"].agent_listen
    say(f"   meridian dataset list; meridian object ls --dataset corpus/web --agent {west}")
    say("   meridian history; meridian audit transfers --cross-border")
    for job, endpoints in world.metrics_endpoints().items():
        say(f"   {job} metrics: " + ", ".join(f"http://{e}/metrics" for e in endpoints))
