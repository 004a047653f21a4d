"""Inline bytes in a change event reach every region's replicator (each reads the whole
log), so the drain inlines them only when every region may hold the dataset; an
EU-only object goes by the origin agent's address, whose sender checks residency."""

from __future__ import annotations

from collections.abc import Sequence

from fakes.admission import compiled
from records_helpers import REGION, StoreFactory

from agents.metrics import AgentMetrics
from agents.records import OutboxDrain, OutboxSettings
from controlplane.domain.placement import Placement
from controlplane.policy.current import CompiledPolicy
from controlplane.ports.changelog import Delivery

AGENT = "127.0.0.1:7001"
REGIONS = {"eu-west": "EU", "eu-central": "EU", "us-east": "US"}


class NoProducer:
    """Test scaffolding: the drain is only asked to encode here."""

    async def send_many(self, topic: str, items: Sequence[tuple[bytes, bytes]]) -> list[Delivery]:
        raise AssertionError("nothing is sent in this test")


def placement(name: str, residency: tuple[str, ...]) -> Placement:
    return Placement(
        dataset=name,
        policy="p",
        dataset_class="standard",
        home="eu-west",
        replicas=("eu-central",),
        residency=residency,
        rpo_s=30,
        failover_mode="manual",
        failover_order=(),
    )


def test_only_datasets_every_region_may_hold_ride_inline(open_store: StoreFactory) -> None:
    store = open_store()
    policy: CompiledPolicy = compiled(
        REGIONS, [placement("eu/docs", ("EU",)), placement("corpus/web", ("EU", "US"))]
    )
    drain = OutboxDrain(
        store,
        NoProducer(),
        AgentMetrics(REGION, "a1"),
        REGION,
        OutboxSettings(origin_agent=AGENT),
        policy=lambda: policy,
    )
    store.put("eu/docs", "a", [b"EU only"], outbox=True, policy_revision=1)
    store.put("corpus/web", "b", [b"anywhere"], outbox=True, policy_revision=1)
    events = {e.dataset: drain._change_event(e) for e in store.outbox_pending()}
    assert events["eu/docs"].inline is None and events["eu/docs"].origin_agent == AGENT
    assert events["corpus/web"].inline == b"anywhere"
    # No policy known: nothing inline (fail closed).
    blind = OutboxDrain(
        store, NoProducer(), AgentMetrics(REGION, "a2"), REGION,
        OutboxSettings(origin_agent=AGENT), policy=lambda: None,
    )  # fmt: skip
    assert all(blind._change_event(e).inline is None for e in store.outbox_pending())
