"""`meridian replicator run --region R`: the change-log applier of one region, as a daemon.

Connects etcd (the applied policy, watched), Kafka (the `meridian.changes` consumer
of group `meridian-replicator-<region>` and a producer for `meridian.dlq`), its
region's agent (gRPC) and the catalog (opened on demand: the data path never waits
for it). Serves Prometheus metrics on `--metrics`, logs JSON lines, stops cleanly
on SIGTERM (events in flight finish, their offsets are committed, the group is
left), and exits non-zero with one sentence when etcd or Kafka is unreachable at
start.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.kafka import CHANGES_TOPIC, KafkaConsumer, KafkaProducer
from controlplane.domain.hlc import HybridClock, offset_ms
from controlplane.errors import ConfigError, MeridianError
from controlplane.logs import get_logger
from controlplane.policy.current import PolicyView
from controlplane.settings import Settings, parse_endpoints
from replicator.agent_follow import AgentFollower
from replicator.agent_grpc import GrpcAgent
from replicator.applier import Applier
from replicator.backfill import Backfill
from replicator.backlog import BacklogProbe
from replicator.catalog_link import CatalogLink
from replicator.config import ReplicatorConfig, group_id
from replicator.dlq import KafkaDeadLetters
from replicator.holders import RegistryHolders
from replicator.journal import RecordJournal
from replicator.metrics import ReplicatorMetrics
from replicator.service import ReplicatorLoop
from replicator.shipper import RecordShipper

log = get_logger("meridian.replicator")


class _Relay:
    """The consumer's rebalance handler, pointing at the loop once it exists."""

    target: ReplicatorLoop | None = None

    async def on_revoked(self, partitions: set[tuple[str, int]]) -> None:
        if self.target is not None:
            await self.target.on_revoked(partitions)

    async def on_assigned(self, partitions: set[tuple[str, int]]) -> None:
        if self.target is not None:
            await self.target.on_assigned(partitions)


async def _check_region(
    agent: GrpcAgent, region: str, *, attempts: int = 5, pause_s: float = 1.0
) -> None:
    """An agent of another region would store the copies there, and the records would
    say `region` holds them: refused at start. One that does not answer in `attempts`
    tries (2 s each, `pause_s` apart: about 10-15 s) is applied through anyway,
    unchecked (said in the log): its copies fail and are retried, as in any outage of
    the region's agent."""
    last: MeridianError | None = None
    for _attempt in range(attempts):
        try:
            serves = await agent.region(timeout_s=2.0)
        except MeridianError as exc:
            last = exc
            await asyncio.sleep(pause_s)
            continue
        if serves != region:
            raise ConfigError(
                f"the agent at {agent.address} serves region {serves}, not {region}: name one "
                f"of {region}'s agents with --agent (or leave --agent and MERIDIAN_AGENT unset "
                "to use one the region registered in etcd)"
            )
        return
    log.warning("replicator_agent_unchecked", region=region, agent=agent.address, error=str(last))


def default_journal(settings: Settings, region: str, replicator_id: str) -> Path:
    return settings.home / "replicator" / f"{region}-{replicator_id}.journal.db"


async def run_replicator(
    settings: Settings,
    config: ReplicatorConfig,
    *,
    agent_address: str,
    replicator_id: str,
    metrics_addr: str | None,
    journal_path: Path | None,
    ready: asyncio.Event | None = None,
    follow_agents: bool = False,
) -> None:
    """Run until SIGTERM or SIGINT (see the module docstring). `follow_agents`: the
    agent was read from the region's registrations, and follows them
    (replicator/agent_follow.py)."""
    region = config.region
    metrics_at = parse_endpoints(metrics_addr, setting="--metrics")[0] if metrics_addr else None
    metrics = ReplicatorMetrics(region)
    journal = RecordJournal(journal_path or default_journal(settings, region, replicator_id))
    catalog = CatalogLink(settings.catalog)
    try:
        await asyncio.to_thread(catalog.open)
    except MeridianError as exc:
        if not exc.retriable:
            journal.close()
            raise
        log.warning(
            "catalog_unreachable_at_start",
            region=region,
            error=str(exc),
            action="applying anyway; records wait in the journal until it answers",
        )
    coord = EtcdCoordination(
        [f"{h}:{p}" for h, p in settings.etcd_endpoints], timeout_s=settings.etcd_timeout_s
    )
    server: Any = None
    try:
        async with AsyncExitStack() as stack:
            await coord.connect()
            stack.push_async_callback(coord.close)
            view = await stack.enter_async_context(PolicyView(coord))
            agent = await stack.enter_async_context(
                GrpcAgent(agent_address, route=settings.agent_address)
            )
            await _check_region(agent, region)
            if follow_agents:
                await stack.enter_async_context(AgentFollower(agent, coord, region))
            producer = await stack.enter_async_context(
                KafkaProducer(settings.kafka, client_id=f"replicator-{region}-{replicator_id}")
            )
            shipper = await stack.enter_async_context(RecordShipper(journal, catalog))
            holders = RegistryHolders(catalog, coord, route=settings.agent_address)
            applier = Applier(
                config,
                agent=agent,
                journal=journal,
                dead_letters=KafkaDeadLetters(producer, region),
                policy=view.require,
                metrics=metrics,
                clock=HybridClock(
                    region,
                    max_clock_skew_ms=config.max_clock_skew_ms,
                    physical_ms=offset_ms(settings.clock_offset_ms),
                ),
                holders=holders,
                sets=agent,
                on_record=shipper.nudge,
                # An event of a revision the view has not reached waits for it only
                # while etcd may hold it (Applier._decided).
                published_revision=view.published_revision,
            )
            relay = _Relay()
            consumer = KafkaConsumer(
                settings.kafka,
                topics=[CHANGES_TOPIC.name],
                group_id=group_id(region),
                client_id=f"replicator-{region}-{replicator_id}",
                rebalance=relay,
                session_timeout_ms=10_000,
            )
            loop = ReplicatorLoop(
                config,
                consumer,
                applier,
                metrics,
                before_commit=lambda: asyncio.to_thread(journal.flush),
            )
            relay.target = loop
            await stack.enter_async_context(consumer)
            await stack.enter_async_context(
                BacklogProbe(catalog, region, metrics, interval_s=config.backlog_interval_s)
            )
            if metrics_at is not None:
                try:
                    server, _thread = start_http_server(
                        metrics_at[1], metrics_at[0], registry=metrics.registry
                    )
                except OSError as exc:
                    raise ConfigError(
                        f"cannot serve metrics on {metrics_addr}: {exc.strerror}"
                    ) from exc
            backfill = Backfill(
                view,
                catalog,
                agent,
                holders.agents_of,
                region,
                # Beside the journal: what was backfilled outlives a restart.
                state_path=journal.path.with_name(journal.path.stem + ".backfill.json"),
            )
            applier.on_not_copied = backfill.forget
            await stack.enter_async_context(backfill)
            await stack.enter_async_context(loop)  # stopped first: drains, commits
            log.info(
                "replicator_started",
                region=region,
                group=group_id(region),
                agent=agent_address,
                journal=str(journal.path),
            )
            if ready is not None:
                ready.set()
            await _until_signal(loop)
            log.info("replicator_signal", region=region, action="stopping")
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        await asyncio.to_thread(catalog.close)
        journal.close()


async def _until_signal(loop: ReplicatorLoop) -> None:
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(sig, stop.set)
    try:
        waiter = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(loop.wait())
        done, _ = await asyncio.wait([waiter, failed], return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, failed):
            if task not in done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if failed in done:
            failed.result()  # the loop died: raise its error
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            running.remove_signal_handler(sig)
