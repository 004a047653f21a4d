"""The agent's records duties as the daemon runs them: the recorder (journal → catalog)
and the outbox drain (outbox → Kafka), with their connections.

Neither the catalog nor Kafka is needed by the data path (dataplane.md, *Records*,
*Classes*): a write commits its journal and outbox rows in the store and returns.
So an agent started while either is down still serves:

* the catalog is tried once at start; an error that will not clear by itself (a
  malformed URL, a catalog never migrated) stops the start with its sentence, a
  catalog that is merely unreachable does not: the recorder gets a catalog whose
  connections are opened on use, and retries with backoff until it answers;
* the Kafka producer is started in the background, retried with backoff, and the
  drain starts once it is up; until then events wait in the outbox.

Stop: the drain, then the producer, then the recorder (each lets its batch in
flight finish within its stop timeout; a cancelled batch is shipped again after a
restart, every record being idempotent), then the catalog's pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings, Recorder, RecorderSettings, track_outbox
from agents.store import ObjectStore
from controlplane.adapters.kafka import KafkaProducer
from controlplane.catalog.api import Catalog, open_catalog
from controlplane.catalog.engine import make_engine
from controlplane.errors import MeridianError
from controlplane.lifecycle import Lifecycle, cancel_and_wait
from controlplane.logs import get_logger
from controlplane.policy.current import CompiledPolicy
from controlplane.policy.placer import place
from controlplane.settings import Settings

log = get_logger("meridian.agent")


def open_catalog_tolerant(url: str) -> Catalog:
    """The catalog at `url`, opened now if it answers, or with lazy connections if it is
    unreachable; raises what will not clear by itself (see the module docstring)."""
    try:
        return open_catalog(url, placer=place)
    except MeridianError as exc:
        if not exc.retriable:
            raise
        log.warning(
            "catalog_unreachable_at_start",
            error=str(exc),
            action="serving anyway; the recorder ships the journal once the catalog answers",
        )
        return Catalog(make_engine(url), url, placer=place)


class RecordDuties(Lifecycle):
    """The recorder and the outbox drain of one agent (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        metrics: AgentMetrics,
        region: str,
        settings: Settings,
        *,
        origin_agent: str,
        policy: Callable[[], CompiledPolicy | None] | None = None,
        retry_initial_s: float = 0.2,
        retry_max_s: float = 5.0,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._region = region
        self._settings = settings
        self._origin_agent = origin_agent
        self._policy = policy
        self._retry = (retry_initial_s, retry_max_s)
        self.catalog: Catalog | None = None
        self.recorder: Recorder | None = None
        self.producer: KafkaProducer | None = None
        self.drain: OutboxDrain | None = None
        self._connecting: asyncio.Task[None] | None = None

    async def _do_start(self) -> None:
        self.catalog = await asyncio.to_thread(open_catalog_tolerant, self._settings.catalog)
        self.recorder = Recorder(
            self._store, self.catalog, self._metrics, self._region, RecorderSettings()
        )
        await self.recorder.start()
        # The outbox's gauges from the start: with Kafka away at start-up the drain does
        # not exist yet, and the backlog (and its age, which the alert reads) must show.
        track_outbox(self._store, self._metrics)
        self._connecting = asyncio.create_task(self._start_drain(), name="outbox-connect")

    async def _start_drain(self) -> None:
        delay = self._retry[0]
        for attempt in range(1, 1_000_000):
            producer = KafkaProducer(
                self._settings.kafka_bootstrap,
                client_id=f"meridian-agent-{self._region}",
                request_timeout_ms=self._settings.kafka_request_timeout_ms,
            )
            try:
                await producer.start()
                break
            except MeridianError as exc:
                await producer.stop()
                log.warning(
                    "kafka_unreachable",
                    attempt=attempt,
                    error=str(exc),
                    retry_in_s=round(delay, 3),
                    action="change events wait in the outbox",
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry[1])
        self.producer = producer
        settings = OutboxSettings(
            origin_agent=self._origin_agent, inline_max_bytes=self._settings.inline_max_bytes
        )
        self.drain = OutboxDrain(
            self._store, producer, self._metrics, self._region, settings, policy=self._policy
        )
        await self.drain.start()
        log.info("outbox_drain_started", bootstrap=self._settings.kafka)

    async def _do_stop(self) -> None:
        if self._connecting is not None:
            await cancel_and_wait(self._connecting)
        if self.drain is not None:
            await self.drain.stop()
        if self.producer is not None:
            await self.producer.stop()
        if self.recorder is not None:
            await self.recorder.stop()
        if self.catalog is not None:
            await asyncio.to_thread(self.catalog.close)
