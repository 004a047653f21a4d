"""Change log on Kafka through aiokafka (see `controlplane.ports.changelog` for the guarantees).

The producer is idempotent with `acks=all`; the consumer never auto-commits. Topics
are created explicitly here (brokers run with auto-create off) with
`unclean.leader.election.enable=false`. aiokafka errors are translated to Meridian
errors in this module only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError

from controlplane.errors import ConfigError, NotFoundError, UnavailableError
from controlplane.lifecycle import Lifecycle
from controlplane.ports.changelog import Delivery, RebalanceHandler, Record, TopicSpec

TOPIC_ALREADY_EXISTS = 36

# The project's topics (ARCHITECTURE.md). Partitions bound the parallelism of appliers.
CHANGES_TOPIC = TopicSpec("meridian.changes", partitions=12)
DLQ_TOPIC = TopicSpec("meridian.dlq", partitions=3)
PROJECT_TOPICS = (CHANGES_TOPIC, DLQ_TOPIC)

SAFE_TOPIC_CONFIG = {"unclean.leader.election.enable": "false"}


def _bootstrap(servers: Sequence[tuple[str, int]] | str) -> str:
    if isinstance(servers, str):
        return servers
    return ",".join(f"{host}:{port}" for host, port in servers)


def _unavailable(what: str, bootstrap: str, exc: BaseException) -> UnavailableError:
    return UnavailableError(f"Kafka at {bootstrap} failed to {what}: {exc or type(exc).__name__}")


class KafkaAdmin(Lifecycle):
    def __init__(
        self, bootstrap: Sequence[tuple[str, int]] | str, request_timeout_ms: int = 30_000
    ) -> None:
        self.bootstrap = _bootstrap(bootstrap)
        self._client = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, request_timeout_ms=request_timeout_ms
        )

    async def _do_start(self) -> None:
        try:
            await self._client.start()
        except KafkaError as exc:
            raise _unavailable("answer a metadata request", self.bootstrap, exc) from exc

    async def _do_stop(self) -> None:
        await self._client.close()

    async def cluster_brokers(self) -> int:
        try:
            meta: dict[str, Any] = await self._client.describe_cluster()
        except KafkaError as exc:
            raise _unavailable("describe the cluster", self.bootstrap, exc) from exc
        return len(meta.get("brokers", []))

    async def list_topics(self) -> list[str]:
        try:
            return list(await self._client.list_topics())
        except KafkaError as exc:
            raise _unavailable("list topics", self.bootstrap, exc) from exc

    async def describe_topic_config(self, topic: str) -> dict[str, str]:
        """The effective configuration of a topic, as the broker reports it."""
        try:
            responses = await self._client.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
        except KafkaError as exc:
            raise _unavailable(f"describe topic {topic}", self.bootstrap, exc) from exc
        config: dict[str, str] = {}
        for response in responses:
            for resource in response.to_object()["resources"]:
                for entry in resource["config_entries"]:
                    config[entry["config_names"]] = entry["config_value"]
        return config

    async def ensure_topics(self, topics: Sequence[TopicSpec]) -> list[str]:
        try:
            existing = set(await self._client.list_topics())
            missing = [t for t in topics if t.name not in existing]
            if not missing:
                return []
            response = await self._client.create_topics(
                [
                    NewTopic(
                        t.name,
                        t.partitions,
                        t.replication_factor,
                        topic_configs={**SAFE_TOPIC_CONFIG, **t.config},
                    )
                    for t in missing
                ]
            )
        except KafkaError as exc:
            raise _unavailable("create topics", self.bootstrap, exc) from exc
        created = []
        for name, code, *rest in response.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TOPIC_ALREADY_EXISTS:  # a concurrent creator won the race: fine
                message = rest[0] if rest else ""
                raise ConfigError(f"Kafka refused to create topic {name}: error {code} {message}")
        return created


class KafkaProducer(Lifecycle):
    """Idempotent, acks=all producer; `send` returns once the record is durable."""

    def __init__(
        self,
        bootstrap: Sequence[tuple[str, int]] | str,
        *,
        client_id: str = "meridian",
        request_timeout_ms: int = 30_000,
        linger_ms: int = 5,
    ) -> None:
        self.bootstrap = _bootstrap(bootstrap)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            request_timeout_ms=request_timeout_ms,
            compression_type=None,
        )

    async def _do_start(self) -> None:
        try:
            await self._producer.start()
        except KafkaError as exc:
            raise _unavailable("start a producer", self.bootstrap, exc) from exc

    async def _do_stop(self) -> None:
        await self._producer.stop()

    async def send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Delivery:
        try:
            meta = await self._producer.send_and_wait(
                topic, value=value, key=key, headers=list(headers)
            )
        except KafkaError as exc:
            raise _unavailable(f"acknowledge a record on {topic}", self.bootstrap, exc) from exc
        return Delivery(meta.topic, meta.partition, meta.offset)

    async def send_many(self, topic: str, items: Sequence[tuple[bytes, bytes]]) -> list[Delivery]:
        """Send a batch pipelined (order per key still holds); return once all are durable."""
        try:
            futures = [await self._producer.send(topic, value=v, key=k) for k, v in items]
            metas = [await f for f in futures]
        except KafkaError as exc:
            raise _unavailable(f"acknowledge records on {topic}", self.bootstrap, exc) from exc
        return [Delivery(m.topic, m.partition, m.offset) for m in metas]


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # untyped base
    def __init__(self, handler: RebalanceHandler) -> None:
        self._handler = handler

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._handler.on_revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self._handler.on_assigned({(tp.topic, tp.partition) for tp in assigned})


class KafkaConsumer(Lifecycle):
    """Group consumer with manual commits only (at least once); `rebalance`, when given,
    is told of partitions revoked and assigned (see `RebalanceHandler`)."""

    def __init__(
        self,
        bootstrap: Sequence[tuple[str, int]] | str,
        *,
        topics: Sequence[str],
        group_id: str,
        client_id: str = "meridian",
        session_timeout_ms: int = 10_000,
        request_timeout_ms: int = 30_000,
        rebalance: RebalanceHandler | None = None,
        max_poll_interval_ms: int = 300_000,
    ) -> None:
        self.bootstrap = _bootstrap(bootstrap)
        self.topics = list(topics)
        self._rebalance = rebalance
        self._consumer = AIOKafkaConsumer(
            *(() if rebalance is not None else topics),
            bootstrap_servers=self.bootstrap,
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=session_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            isolation_level="read_committed",
            max_poll_interval_ms=max_poll_interval_ms,
        )
        if rebalance is not None:
            # A listener can only be given with subscribe(), not with the topics above.
            self._consumer.subscribe(self.topics, listener=_Rebalance(rebalance))

    async def _do_start(self) -> None:
        try:
            await self._consumer.start()
        except UnknownTopicOrPartitionError as exc:
            raise NotFoundError(
                f"Kafka at {self.bootstrap} has no topic {', '.join(self.topics)}; topics are "
                "created by the project (auto-create is off): run `meridian stack up` or create it"
            ) from exc
        except KafkaError as exc:
            raise _unavailable("start a consumer", self.bootstrap, exc) from exc

    async def _do_stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except KafkaError as exc:
            raise _unavailable("fetch records", self.bootstrap, exc) from exc
        records = []
        for tp, messages in batches.items():
            for m in messages:
                records.append(
                    Record(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=m.offset,
                        key=m.key,
                        value=m.value if m.value is not None else b"",
                        headers=tuple((h[0], bytes(h[1])) for h in (m.headers or ())),
                    )
                )
        return records

    async def commit(self, records: Sequence[Record]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            raise _unavailable("commit offsets", self.bootstrap, exc) from exc


async def fast_forward_group(
    bootstrap: Sequence[tuple[str, int]] | str, group_id: str, topic: str
) -> int:
    """Commit the end of every partition of `topic` for `group_id`, so the group's next
    consumer starts from now rather than from what earlier runs left (the demo's fresh
    regions must not replay a previous run's events); how many partitions."""
    servers = _bootstrap(bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=servers, group_id=group_id, enable_auto_commit=False
    )
    try:
        await consumer.start()
        await consumer.topics()  # loads the cluster's metadata
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:  # seen empty even after topics(): the project's own count
            known = {t.name: t.partitions for t in PROJECT_TOPICS}
            partitions = set(range(known.get(topic, 1)))
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if tps:
            consumer.assign(tps)  # aiokafka commits only offsets of assigned partitions
            ends = await consumer.end_offsets(tps)
            await consumer.commit({tp: off for tp, off in ends.items()})
        return len(tps)
    except KafkaError as exc:
        raise _unavailable(f"move group {group_id} to the end of {topic}", servers, exc) from exc
    finally:
        await consumer.stop()
