"""A catalog outage (PostgreSQL behind a real Toxiproxy, disabled then enabled): the
store keeps taking writes, the recorder backs off, the lag gauge rises, and once the
catalog is back the recorder catches up and the gauge falls to 0."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from harness.catalogs import scratch_postgres
from harness.ports import free_port
from records_helpers import DATASET, REGION, StoreFactory, applied_catalog
from sqlalchemy.engine import make_url
from waiting import until

from agents.metrics import AgentMetrics
from agents.records import Recorder, RecorderSettings
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.catalog import migrate
from controlplane.catalog.api import Catalog

pytestmark = pytest.mark.integration


@pytest.fixture
def proxied_catalog(
    postgres_url: str, toxiproxy_url: str
) -> Iterator[tuple[Catalog, ToxiproxyClient, str]]:
    with scratch_postgres(postgres_url) as direct:
        migrate.upgrade(direct)
        client = ToxiproxyClient(toxiproxy_url)
        name = f"rec-catalog-{uuid.uuid4().hex[:6]}"
        listen = free_port()
        server = make_url(direct)
        client.create_proxy(name, f"127.0.0.1:{listen}", f"127.0.0.1:{server.port}")
        try:
            catalog = applied_catalog(server.set(port=listen).render_as_string(hide_password=False))
            try:
                yield catalog, client, name
            finally:
                catalog.close()
        finally:
            client.delete_proxy(name)


async def test_the_recorder_catches_up_after_a_catalog_outage(
    proxied_catalog: tuple[Catalog, ToxiproxyClient, str],
    open_store: StoreFactory,
    metrics: AgentMetrics,
) -> None:
    cat, proxy, name = proxied_catalog
    store = open_store()
    settings = RecorderSettings(idle_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.3)
    recorder = Recorder(store, cat, metrics, REGION, settings)

    def behind() -> float:
        value = metrics.registry.get_sample_value("meridian_records_behind_seconds")
        return -1.0 if value is None else value

    async with recorder:
        began = time.monotonic()
        for i in range(20):
            store.put(DATASET, f"b{i}", [b"before %d" % i])
        healthy_s = time.monotonic() - began
        await until(lambda: store.journal_pending() == [], 30, "the first records to ship")

        proxy.disable(name)
        began = time.monotonic()
        written = [store.put(DATASET, f"k{i}", [b"during %d" % i]) for i in range(20)]
        # The data path does not wait for the catalog: 20 puts take about as long as 20
        # with it up (judged against those, as the shared disk's fsyncs vary by seconds).
        outage_s = time.monotonic() - began
        assert outage_s < 3 * healthy_s + 2, (outage_s, healthy_s)
        await until(lambda: recorder.failing is not None, 30, "the recorder to see the outage")
        await until(lambda: behind() > 0.1, 30, "the lag gauge to show the backlog")
        first = behind()
        await until(lambda: behind() >= first + 0.5, 30, "the lag gauge to rise")
        assert len(store.journal_pending()) == 20

        proxy.enable(name)
        # The journal empties on the worker thread before the loop clears `failing`.
        await until(
            lambda: behind() == 0 and recorder.failing is None, 30, "the recorder to catch up"
        )

    for i, version in enumerate(written):
        [replica] = cat.replica_status(DATASET, key=f"k{i}")
        assert (replica.version, replica.region, replica.state) == (
            version.hlc.text,
            REGION,
            "completed",
        )
    assert metrics.registry.get_sample_value("meridian_records_shipped_total") == 40
