"""A watch cut mid catch-up resumes after the last event it delivered, through a real
Toxiproxy link that closes each connection after a fixed number of bytes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from harness.ports import free_port
from structlog.testing import capture_logs

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.adapters.toxiproxy import ToxiproxyClient
from controlplane.stack.etcd import EtcdCluster

pytestmark = pytest.mark.integration

PREFIX = "/meridian/test/resume/"
KEYS = 2500  # etcd sends a catch-up in responses of at most 1,000 revisions
VALUE = b"v" * 1024  # so each full response is about 1.05 MB
CUT_AFTER = 1_500_000  # bytes per connection: one whole response, then a cut mid-next


async def test_watch_cut_mid_catch_up_delivers_every_event_once(
    coord: EtcdCoordination, etcd3: EtcdCluster, toxiproxy_url: str
) -> None:
    start = await coord.revision()
    revisions: list[int] = []
    for first in range(0, KEYS, 50):
        puts = [coord.put(f"{PREFIX}{i:05d}", VALUE) for i in range(first, first + 50)]
        revisions += await asyncio.gather(*puts)
    toxi = ToxiproxyClient(toxiproxy_url, timeout_s=5)
    port = free_port()
    listen, proxy = f"127.0.0.1:{port}", f"watch-resume-{port}"
    await asyncio.to_thread(toxi.create_proxy, proxy, listen, etcd3.endpoints[0])
    cut = EtcdCoordination([listen], timeout_s=5)
    try:
        await asyncio.to_thread(toxi.add_limit_data, proxy, CUT_AFTER)
        await cut.connect()
        seen: list[int] = []

        async def collect() -> None:
            async for ev in cut.watch(PREFIX, prefix=True, start_revision=start + 1):
                seen.append(ev.revision)
                if len(seen) == KEYS:
                    return

        with capture_logs() as logs, contextlib.suppress(TimeoutError):
            await asyncio.wait_for(collect(), 60)  # the assertions say what arrived
        broken = [e for e in logs if e["event"] == "etcd_watch_broken"]
    finally:
        await cut.close()
        await asyncio.to_thread(toxi.delete_proxy, proxy)
    assert broken, "the link never cut the watch, so this test proved nothing"
    assert seen == sorted(revisions), (
        f"{len(seen)} of {KEYS} events, first gap after revision "
        f"{next((a for a, b in itertools.pairwise(seen) if b != a + 1), None)}"
    )
