"""Run the demo: the local stack, four regions and Prometheus, the story, and the stop.

The issue asks for three regions; the demo runs a fourth, `eu-north`, because the
checkpoints are critical with `ack: quorum`: on two EU copies a quorum is both, so
losing `eu-west` would stop every checkpoint write (durability over availability: a
write is never acked on one copy). With three EU copies the quorum is 2 and writes go
on after a region is lost. `eu-north` holds no standard dataset, so it runs only a
controller and an agent (no replicator)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from controlplane.demo.probe import Probe
from controlplane.demo.steps import SCALES, Check, Story
from controlplane.demo.world import Daemon, World
from controlplane.errors import StackError
from controlplane.logs import get_logger
from controlplane.loopback import free_port
from controlplane.settings import Settings

log = get_logger("meridian.demo")

REGIONS = {"eu-west": "EU", "eu-central": "EU", "eu-north": "EU", "us-east": "US"}
KINDS: dict[str, tuple[str, ...]] = {"eu-north": ("controller", "agent")}
# The links of examples/policies/training.yaml, put on the wire by Toxiproxy.
RTT_MS = {
    frozenset(("eu-west", "eu-central")): 8,
    frozenset(("eu-west", "eu-north")): 12,
    frozenset(("eu-central", "eu-north")): 10,
    frozenset(("eu-west", "us-east")): 80,
    frozenset(("eu-central", "us-east")): 90,
    frozenset(("eu-north", "us-east")): 95,
}
POLICY = Path(__file__).parents[2] / "examples" / "policies" / "training.yaml"
SCRAPE_INTERVAL_S = 2.0


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
        for name, region in world.regions.items():
            if "replicator" in region.kinds:
                await fast_forward_group(
                    settings.kafka_bootstrap, f"meridian-replicator-{name}", CHANGES_TOPIC.name
                )

    asyncio.run(reset())


class Demo:
    """One run: `start`, `story`, then `stop` (always; it is idempotent)."""

    def __init__(self, settings: Settings, *, scale: str, say: Callable[[str], None]) -> None:
        from controlplane.stack.manager import Stack, endpoints

        self.say = say
        self.plan = SCALES[scale]
        self.started = time.monotonic()
        say("Starting the local stack (etcd, Kafka, Toxiproxy) if it is not up…")
        self.stack = Stack(settings)
        # What this run started of the stack is stopped again at the end; what was
        # already up (a developer's stack, the test session's) is left alone.
        self.stack_started = self.stack.up(progress=lambda line: say(f"   {line}")).started
        # The demo runs on the local stack it just made sure of, wherever MERIDIAN_ETCD points.
        stack = endpoints(settings)
        self.settings = Settings(
            **{
                **settings.model_dump(),
                "etcd": stack["etcd"],
                "kafka": stack["kafka"],
                "toxiproxy": stack["toxiproxy"].removeprefix("http://"),
            }
        )
        self.run_dir = settings.home / "demo" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.world = World(
            self.run_dir,
            regions=REGIONS,
            rtt_ms=RTT_MS,
            etcd=self.settings.etcd,
            kafka=self.settings.kafka,
            toxiproxy=self.settings.toxiproxy,
            kinds=KINDS,
        )
        self.probe = Probe(self.settings.etcd)
        self.prometheus_listen = f"127.0.0.1:{free_port()}"
        self.prometheus: Daemon | None = None

    def start(self) -> None:
        world = self.world
        _reset_shared_state(self.settings, world)
        for args in (("db", "upgrade"), ("policy", "apply", str(POLICY), "--yes")):
            done = world.cli(*args)
            if done.returncode != 0:
                raise StackError(f"`meridian {' '.join(args)}` failed: {done.stderr.strip()}")
        self.say(
            f"Applied {POLICY.name}: checkpoints critical in three EU regions (quorum 2), "
            "the corpus in the EU and US."
        )
        world.make_links()
        self.start_prometheus()
        world.start_regions(list(REGIONS))
        self.say(
            f"{len(REGIONS)} regions up ({', '.join(REGIONS)}; eu-north runs no replicator: "
            f"it holds no standard dataset), Prometheus at http://{self.prometheus_listen}, "
            f"logs in {self.run_dir / 'logs'}."
        )

    def start_prometheus(self) -> None:
        from controlplane.observability.scrape import write_scrape_config
        from controlplane.stack import prometheus

        config = write_scrape_config(
            self.run_dir / "prometheus" / "prometheus.yml",
            self.world.metrics_endpoints(),
            regions=self.world.metrics_regions(),
            scrape_interval_s=SCRAPE_INTERVAL_S,
        )
        self.prometheus = Daemon(
            "prometheus",
            prometheus.argv(config, self.run_dir / "prometheus" / "data", self.prometheus_listen),
            {},
            self.run_dir / "logs" / "prometheus.log",
            self.prometheus_listen,
        )
        self.prometheus.start()
        self.prometheus.wait_ready(60)

    def story(self) -> list[Check]:
        (self.run_dir / "work").mkdir(exist_ok=True)
        story = Story(self.world, self.plan, self.run_dir / "work", self.say, self.probe)
        for step in story.steps():
            story.run_step(step)
        self.say(f"Done in {time.monotonic() - self.started:.0f} s.")
        return story.checks

    def explore(self) -> list[str]:
        """How to look around while the demo is kept running (also logged as one line)."""
        west = self.world.regions["eu-west"].agent_listen
        lines = ["Left running (--keep) until Ctrl-C. Try, in another shell:"]
        lines += [f"   export {key}={value}" for key, value in self.world.env().items()]
        lines += [
            "   meridian region list; meridian dataset list",
            f"   meridian object ls --dataset corpus/web --agent {west}",
            "   meridian replication status; meridian history",
            "   meridian audit residency; meridian audit transfers --cross-border",
            f"   Prometheus: http://{self.prometheus_listen} "
            "(try meridian:replication_lag_seconds:max, meridian_controller_datasets_owned)",
        ]
        endpoints = self.world.metrics_endpoints()
        for job, addresses in endpoints.items():
            lines.append(
                f"   {job} metrics: " + ", ".join(f"http://{a}/metrics" for a in addresses)
            )
        log.info(
            "demo_kept",
            prometheus=f"http://{self.prometheus_listen}",
            run_dir=str(self.run_dir),
            metrics=endpoints,
            agents={name: r.agent_listen for name, r in self.world.regions.items()},
        )
        (self.run_dir / "explore.json").write_text(
            json.dumps(
                {
                    "prometheus": f"http://{self.prometheus_listen}",
                    "metrics": endpoints,
                    "env": self.world.env(),
                },
                indent=2,
            )
            + "\n"
        )
        return lines

    def stop(self) -> None:
        self.world.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        services = self.stack.services()
        for name in reversed(self.stack_started):
            services[name].stop()
        self.stack_started = []
